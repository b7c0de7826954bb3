// Shared by the rhea test clients (tests/test_rhea_interop.py runs them).
//
// Options come from argv (--name value, or --flag) with RHEA_NAME environment variables
// as fallback.  Every script prints one JSON object per line on stdout ({"event": ...}),
// exits 0 when it did what it was asked, 1 on an AMQP error, 2 when its own --timeout
// (seconds) expires first, so a script always ends by itself.
//
// Bodies are described the same way in both directions, so a test can compare what a
// sender was given with what a receiver printed:
//   {"type": "string", "value": "hi"}        AmqpValue string
//   {"type": "map", "value": {"k": 1}}       AmqpValue map (string keys)
//   {"type": "list", "value": [1, "a"]}      AmqpValue list
//   {"type": "number"|"boolean"|"null", "value": ...}   other AmqpValue scalars
//   {"type": "binary", "base64": "..."}      AmqpValue binary
//   {"type": "data", "base64": "..."}        one Data section
//   {"type": "sequence", "value": [...]}     one AmqpSequence section
//   {"type": "none"}                         no body section
'use strict';

const rhea = require('rhea');

function parse_args(spec) {
    // spec: {name: default}; a boolean default makes --name a flag.
    const argv = process.argv.slice(2);
    const out = {};
    for (const name of Object.keys(spec)) {
        const env = process.env['RHEA_' + name.toUpperCase().replace(/-/g, '_')];
        out[name] = env !== undefined ? (typeof spec[name] === 'boolean' ? env === '1' : env)
            : spec[name];
    }
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i];
        if (!arg.startsWith('--')) fail('usage', 'unexpected argument ' + arg);
        const name = arg.slice(2);
        if (!(name in spec)) fail('usage', 'unknown option ' + arg);
        if (typeof spec[name] === 'boolean') {
            out[name] = true;
        } else {
            if (i + 1 >= argv.length) fail('usage', 'missing value for ' + arg);
            out[name] = argv[++i];
        }
    }
    for (const name of Object.keys(spec)) {
        if (typeof spec[name] === 'number') out[name] = Number(out[name]);
    }
    return out;
}

function emit(event, fields) {
    process.stdout.write(JSON.stringify(Object.assign({event: event}, fields || {})) + '\n');
}

function fail(where, detail, code) {
    emit('error', {where: where, detail: detail});
    process.exit(code === undefined ? 1 : code);
}

function condition(error) {
    if (!error) return null;
    return {condition: error.condition === undefined ? null : String(error.condition),
        description: error.description === undefined ? null : error.description};
}

// The script's own deadline: whatever happens, it ends.
function deadline(seconds, state) {
    // ref'd: it also keeps node running until a script exits explicitly
    return setTimeout(function () {
        emit('timeout', {seconds: seconds, state: state ? state() : null});
        process.exit(2);
    }, seconds * 1000);
}

// A connection with SASL ANONYMOUS (rhea skips SASL without a user name, which the
// broker refuses), no reconnect, and every error turned into an "error" line and exit 1.
function connect(opts, container_id) {
    const container = rhea.create_container({id: container_id});
    let closing = false;
    container.on('connection_error', function (context) {
        fail('connection', condition(context.connection.error));
    });
    container.on('session_error', function (context) {
        fail('session', condition(context.session.error));
    });
    container.on('sender_error', function (context) {
        fail('sender', condition(context.sender.error));
    });
    container.on('receiver_error', function (context) {
        fail('receiver', condition(context.receiver.error));
    });
    container.on('disconnected', function (context) {
        if (!closing) fail('disconnected', context.error ? String(context.error) : null);
    });
    container.on('error', function (error) {
        fail('container', String(error));
    });
    const connection = container.connect({
        host: opts.host, port: Number(opts.port), username: opts.username || 'anonymous',
        reconnect: false, container_id: container_id,
    });
    connection.finish = function (fields) {
        // close cleanly, then report "done" once the broker has answered the close
        closing = true;
        connection.once('connection_close', function () {
            emit('done', fields);
            process.exit(0);
        });
        connection.close();
    };
    return connection;
}

function encode_body(spec) {
    switch (spec.type) {
    case 'string': case 'map': case 'list': case 'number': case 'boolean': case 'null':
        return spec.value;
    case 'binary': return Buffer.from(spec.base64, 'base64');
    case 'data': return rhea.message.data_section(Buffer.from(spec.base64, 'base64'));
    case 'sequence': return rhea.message.sequence_section(spec.value);
    case 'none': return undefined;
    default: fail('usage', 'unknown body type ' + spec.type);
    }
}

function plain(value) {
    // a decoded AMQP value as JSON (binary as {"base64": ...})
    if (Buffer.isBuffer(value)) return {base64: value.toString('base64')};
    if (Array.isArray(value)) return value.map(plain);
    if (value !== null && typeof value === 'object') {
        const out = {};
        for (const k of Object.keys(value)) out[k] = plain(value[k]);
        return out;
    }
    if (typeof value === 'bigint') return value.toString();
    return value;
}

function describe_body(body) {
    if (body === undefined) return {type: 'none'};
    // rhea decodes Data and AmqpSequence sections as its (unexported) Section class
    if (body !== null && typeof body === 'object' && typeof body.collect_sections === 'function') {
        if (body.typecode === 0x75) {
            if (body.multiple) return {type: 'data', sections: body.content.map(plain)};
            return {type: 'data', base64: body.content.toString('base64')};
        }
        if (body.typecode === 0x76) return {type: 'sequence', value: plain(body.content)};
        return {type: 'section-' + body.typecode, value: plain(body.content)};
    }
    if (Buffer.isBuffer(body)) return {type: 'binary', base64: body.toString('base64')};
    if (typeof body === 'string') return {type: 'string', value: body};
    if (Array.isArray(body)) return {type: 'list', value: plain(body)};
    if (body === null) return {type: 'null', value: null};
    if (typeof body === 'object') return {type: 'map', value: plain(body)};
    return {type: typeof body, value: plain(body)};
}

// The parts of a received message a test looks at.
function describe_message(message) {
    const out = {body: describe_body(message.body)};
    for (const field of ['to', 'reply_to', 'subject', 'message_id', 'correlation_id',
        'content_type', 'durable', 'delivery_count']) {
        if (message[field] !== undefined && message[field] !== null) {
            out[field] = plain(message[field]);
        }
    }
    for (const field of ['application_properties', 'message_annotations']) {
        if (message[field] !== undefined && message[field] !== null) {
            out[field] = plain(message[field]);
        }
    }
    return out;
}

// A message spec from JSON ({"body": {...}, "to": ..., ...}) as a rhea message.
function build_message(spec) {
    const msg = {};
    for (const k of Object.keys(spec)) {
        if (k !== 'body') msg[k] = spec[k];
    }
    const body = encode_body(spec.body || {type: 'none'});
    if (body !== undefined) msg.body = body;
    return msg;
}

module.exports = {
    rhea, parse_args, emit, fail, condition, deadline, connect,
    describe_body, describe_message, build_message,
};
