// Receive N messages from an address (or from a dynamic node with --dynamic) and print
// each one.
//
//   node receive.js --port P (--address A | --dynamic) --count N [--no-autoaccept]
//                   [--selector TEXT] [--drain] [--copy] [--timeout SECONDS]
//
// Prints "receiver_open" with the source address the broker attached (for --dynamic, the
// address it created), then "message" per message (index, the delivery's `settled` as the
// broker sent it, and the message; see common.js), then "done".  --selector attaches
// with a JMS selector (rhea's filter.selector); "receiver_open" then says which
// selector the broker echoed in the source's filter.  The test publishes only
// after "receiver_open".  With autoaccept (the default) rhea accepts each unsettled
// delivery as it arrives.  --drain: no credit window; once open, N credits with drain
// set (rhea's drain_credit), and "drained" (with the count received) ends it when the
// broker's drained flow comes.  --copy: the source asks for distribution-mode copy
// (browsing a queue); "receiver_open" says which mode the broker echoed.
'use strict';
const c = require('./common');

const opts = c.parse_args({host: '127.0.0.1', port: '5672', address: '', dynamic: false,
    count: 1, 'no-autoaccept': false, timeout: 10, id: 'rhea-receive', selector: '',
    drain: false, copy: false});
let received = 0;
c.deadline(opts.timeout, function () { return {received: received}; });
const connection = c.connect(opts, opts.id);
const source = opts.dynamic ? {dynamic: true} : {address: opts.address};
if (opts.selector) source.filter = require('rhea').filter.selector(opts.selector);
if (opts.copy) source.distribution_mode = 'copy';
const receiver = connection.open_receiver({source: source, autoaccept: !opts['no-autoaccept'],
    credit_window: opts.drain ? 0 : Math.max(opts.count, 1)});

receiver.on('receiver_open', function (context) {
    const remote = context.receiver.source;
    const filter = remote && remote.filter ? remote.filter['jms-selector'] : null;
    c.emit('receiver_open', {address: remote ? remote.address : null,
        dynamic: remote ? Boolean(remote.dynamic) : null,
        selector: filter ? String(filter.value) : null,
        distribution_mode: remote && remote.distribution_mode
            ? String(remote.distribution_mode) : null});
    if (opts.drain) {
        context.receiver.add_credit(opts.count);
        context.receiver.drain_credit();
    } else if (opts.count === 0) connection.finish({received: 0});
});
receiver.on('receiver_drained', function () {
    c.emit('drained', {received: received});
    setImmediate(function () { connection.finish({received: received}); });
});
receiver.on('message', function (context) {
    c.emit('message', {index: received, settled: Boolean(context.delivery.remote_settled),
        message: c.describe_message(context.message)});
    received++;
    if (received === opts.count && !opts.drain) {
        // the accept of the last message goes out (autoaccept) before the close
        setImmediate(function () { connection.finish({received: received}); });
    }
});
