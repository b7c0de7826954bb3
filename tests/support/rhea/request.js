// The "client" of request/response: open a receiver with a dynamic source, learn the
// address the broker created from its attach, and send N requests to a service address
// with reply_to = that address; wait for the N replies.  Request i has message_id
// "<id>-<i>" and the string body "request-<id>-<i>" (--id is also the container id).
//
//   node request.js --port P --address SERVICE --count N [--timeout SECONDS]
//
// Prints "receiver_open" (address, dynamic), "sent" and "accepted"/... per request,
// "reply" per reply (the message; see common.js), "done" once all N replies arrived.
// A dynamic source attached without an address is an error (exit 1; the broker's detach
// error is reported when it follows within 2 s).
'use strict';
const c = require('./common');

const opts = c.parse_args({host: '127.0.0.1', port: '5672', address: 'service', count: 1,
    timeout: 10, id: 'rhea-request'});
const counts = {sent: 0, accepted: 0, replies: 0};
c.deadline(opts.timeout, function () { return counts; });
const connection = c.connect(opts, opts.id);

const receiver = connection.open_receiver({source: {dynamic: true}});
receiver.on('receiver_open', function (context) {
    const source = context.receiver.source;
    const reply_to = source ? source.address : null;
    c.emit('receiver_open', {address: reply_to, dynamic: source ? Boolean(source.dynamic) : null});
    if (!reply_to) {
        // a refusing broker attaches with a null source, then detaches with its error:
        // let that error (receiver_error) be the one reported, if it comes soon
        setTimeout(function () {
            c.fail('receiver', 'dynamic source attached without an address');
        }, 2000);
        return;
    }
    const sender = connection.open_sender({target: {address: opts.address}});
    sender.on('sendable', function () {
        while (counts.sent < opts.count && sender.sendable()) {
            const id = opts.id + '-' + counts.sent;
            sender.send({message_id: id, reply_to: reply_to, body: 'request-' + id});
            c.emit('sent', {message_id: id});
            counts.sent++;
        }
    });
    sender.on('accepted', function () { counts.accepted++; c.emit('accepted'); });
    for (const kind of ['rejected', 'released', 'modified']) {
        sender.on(kind, function (context) {
            const state = context.delivery.remote_state;
            c.fail('request', {outcome: kind, error: c.condition(state && state.error)});
        });
    }
});
receiver.on('message', function (context) {
    counts.replies++;
    c.emit('reply', {settled: Boolean(context.delivery.remote_settled),
        message: c.describe_message(context.message)});
    if (counts.replies === opts.count) {
        setImmediate(function () { connection.finish(counts); });
    }
});
