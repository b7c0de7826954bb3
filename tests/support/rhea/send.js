// Send messages to an address (or, with --address "", over the anonymous relay with a
// `to` on each message) and report each delivery's outcome.
//
//   node send.js --port P --address A [--count N --prefix S | --messages JSON]
//                [--settled] [--durable] [--timeout SECONDS]
//
// --messages is a JSON array of message specs ({"body": {...}, "to": ..., ...}; see
// common.js); without it, N string bodies "<prefix>-<i>" are sent.  Unsettled (the
// default), it prints "sent" per transfer, then "accepted" / "rejected" / "released" /
// "modified" per outcome, and "done" with the counts once every outcome is in (exit 0
// even if some were not accepted: the test judges).  --settled sends pre-settled and
// ends after the last transfer.
'use strict';
const c = require('./common');

const opts = c.parse_args({host: '127.0.0.1', port: '5672', address: '', count: 1,
    prefix: 'msg', messages: '', settled: false, durable: false, timeout: 10,
    id: 'rhea-send'});
let specs;
if (opts.messages) {
    specs = JSON.parse(opts.messages);
} else {
    specs = [];
    for (let i = 0; i < opts.count; i++) {
        specs.push({body: {type: 'string', value: opts.prefix + '-' + i}});
    }
}
if (opts.durable) specs = specs.map(function (s) { return Object.assign({durable: true}, s); });

const counts = {sent: 0, accepted: 0, rejected: 0, released: 0, modified: 0};
c.deadline(opts.timeout, function () { return counts; });
const connection = c.connect(opts, opts.id);
const target = opts.address ? {address: opts.address} : {};
const sender = connection.open_sender({target: target, snd_settle_mode: opts.settled ? 1 : 0,
    treat_modified_as_released: false});

let next = 0;
function outcome(kind) {
    return function (context) {
        counts[kind]++;
        const state = context.delivery.remote_state;
        c.emit(kind, {index: context.delivery.index,
            error: c.condition(state && state.error)});
        if (counts.accepted + counts.rejected + counts.released + counts.modified
                === specs.length) {
            connection.finish(counts);
        }
    };
}

sender.on('sender_open', function (context) {
    c.emit('sender_open', {address: context.sender.remote.attach.target
        ? context.sender.remote.attach.target.address : null});
});
sender.on('sendable', function () {
    while (next < specs.length && sender.sendable()) {
        const delivery = sender.send(c.build_message(specs[next]));
        delivery.index = next;
        c.emit('sent', {index: next});
        counts.sent++;
        next++;
    }
    if (opts.settled && next === specs.length) connection.finish(counts);
});
sender.on('accepted', outcome('accepted'));
sender.on('rejected', outcome('rejected'));
sender.on('released', outcome('released'));
sender.on('modified', outcome('modified'));
