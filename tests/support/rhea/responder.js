// The "server" of request/response: receive requests on a service address and answer
// each at its reply_to, as rhea's and proton's server examples do.
//
//   node responder.js --port P --address SERVICE --count N [--via link|anonymous]
//                     [--timeout SECONDS]
//
// The reply carries correlation_id = the request's message_id and the string body
// "reply:" + the request's text (its string body, or a Data section read as UTF-8, so
// a request whose body type was changed on the way is still answered; "request" prints
// the body as it arrived).  --via link (the default) opens one sender per reply_to
// address; --via anonymous sends every reply over one anonymous-relay sender (null
// target, `to` per message).  Prints "receiver_open" when it is ready, "request" per
// request, "replied" per reply outcome, "done" after N replies are accepted.
'use strict';
const c = require('./common');

const opts = c.parse_args({host: '127.0.0.1', port: '5672', address: 'service', count: 1,
    via: 'link', timeout: 10, id: 'rhea-responder'});
const counts = {requests: 0, accepted: 0};
c.deadline(opts.timeout, function () { return counts; });
const connection = c.connect(opts, opts.id);
const senders = {};   // target address ('' for the anonymous relay) -> {sender, pending}

function sender_for(address) {
    if (senders[address] === undefined) {
        const entry = {pending: []};
        entry.sender = connection.open_sender({target: address ? {address: address} : {}});
        entry.sender.on('sendable', function () { flush(entry); });
        entry.sender.on('accepted', function () {
            counts.accepted++;
            c.emit('replied', {outcome: 'accepted'});
            if (counts.accepted === opts.count) connection.finish(counts);
        });
        for (const kind of ['rejected', 'released', 'modified']) {
            entry.sender.on(kind, function (context) {
                const state = context.delivery.remote_state;
                c.fail('reply', {outcome: kind, error: c.condition(state && state.error)});
            });
        }
        senders[address] = entry;
    }
    return senders[address];
}

function flush(entry) {
    while (entry.pending.length && entry.sender.sendable()) {
        entry.sender.send(entry.pending.shift());
    }
}

function text_of(body) {
    if (typeof body === 'string') return body;
    if (body && typeof body.collect_sections === 'function' && Buffer.isBuffer(body.content)) {
        return body.content.toString('utf8');
    }
    if (Buffer.isBuffer(body)) return body.toString('utf8');
    return JSON.stringify(body);
}

const receiver = connection.open_receiver({source: {address: opts.address}});
receiver.on('receiver_open', function (context) {
    c.emit('receiver_open', {address: context.receiver.source
        ? context.receiver.source.address : null});
});
receiver.on('message', function (context) {
    const request = context.message;
    counts.requests++;
    c.emit('request', {message: c.describe_message(request)});
    if (!request.reply_to) c.fail('request', 'no reply_to');
    const reply = {correlation_id: request.message_id, body: 'reply:' + text_of(request.body)};
    let entry;
    if (opts.via === 'anonymous') {
        reply.to = request.reply_to;
        entry = sender_for('');
    } else {
        entry = sender_for(request.reply_to);
    }
    entry.pending.push(reply);
    flush(entry);
});
