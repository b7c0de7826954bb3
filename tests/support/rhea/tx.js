// One AMQP 1.0 local transaction by hand: rhea has no transaction API (amqp/rhea#333),
// so this script attaches a sender to a coordinator target (amqp:coordinator:list with
// the capability amqp:local-transactions), sends declare, sends --count string
// messages "<prefix>-<i>" to --address under transactional-state(txn-id), waits for
// their answers, then sends discharge (--fail: roll back) and reports its outcome.
//
//   node tx.js --port P --address A [--count N --prefix S] [--fail] [--timeout SECONDS]
//
// Prints "declared" {txn (hex)}, "answered" {index, state} per transfer (state: the
// descriptor code of the broker's delivery state, 52 = transactional-state, or the
// outcome's name), "discharged" {outcome, error}, then "done".
//
// rhea puts no state on a transfer: its transfer frame maker (rhea/lib/frames, the
// module rhea's session uses) is wrapped to add transactional-state(txn-id) to the
// data sender's transfers.  That leans on rhea's internals, pinned in
// package-lock.json.
'use strict';
const c = require('./common');
const frames = require('rhea/lib/frames');

const types = c.rhea.types;
const opts = c.parse_args({host: '127.0.0.1', port: '5672', address: '', count: 1,
    prefix: 'tx', fail: false, timeout: 10, id: 'rhea-tx'});
c.deadline(opts.timeout);

const TRANSACTIONAL_STATE = 0x34;
// The coordinator's messages as raw bytes, one amqp-value section each (rhea folds a
// described body into the section's own descriptor): declare(), discharge(txn, fail).
const DECLARE = Buffer.from([0x00, 0x53, 0x77, 0x00, 0x53, 0x31, 0x45]);
function discharge_message(id, fail) {
    return Buffer.concat([Buffer.from([0x00, 0x53, 0x77, 0x00, 0x53, 0x32,
        0xc0, 4 + id.length, 2, 0xa0, id.length]), id, Buffer.from([fail ? 0x41 : 0x42])]);
}
const STATE = 7;    // the transfer frame's field index of "state"
let txn = null;
let data_handle = null;
const transfer = frames.transfer;
frames.transfer = function (fields) {
    const frame = transfer(fields);
    if (txn !== null && fields.handle === data_handle) {
        frame.rcv_settle_mode = null;
        frame.value[STATE] = types.described(types.wrap_ulong(TRANSACTIONAL_STATE),
            types.wrap_list([types.wrap_binary(txn)]));
    }
    return frame;
};

function state_of(delivery) {
    const s = delivery.remote_state;
    if (!s) return null;
    if (s.constructor && s.constructor.composite_type) return s.constructor.composite_type;
    return s.descriptor ? Number(s.descriptor.value) : null;
}

const connection = c.connect(opts, opts.id);
const ctrl = connection.open_sender({name: 'rhea-txn-ctrl'});
// (the attach is written once the connection is open: its target is replaced first)
ctrl.local.attach.target = types.described(types.wrap_ulong(0x30), types.wrap_list([
    types.wrap_array([types.wrap_symbol('amqp:local-transactions')], 0xa3)]));
const out = connection.open_sender({target: {address: opts.address}});
data_handle = out.local.handle;

let declare = null, discharge = null, sent = 0, answered = 0;

function send_data() {
    while (txn !== null && sent < opts.count && out.sendable()) {
        const delivery = out.send({body: opts.prefix + '-' + sent});
        delivery.index = sent++;
    }
}

ctrl.on('sendable', function () {
    if (declare === null) {
        declare = ctrl.send(DECLARE, undefined, 0);
    }
});
ctrl.on('settled', function (context) {
    const delivery = context.delivery;
    if (delivery === declare) {
        const s = delivery.remote_state;
        if (state_of(delivery) !== 0x33) c.fail('declare', {state: state_of(delivery)});
        txn = Buffer.from(s.value[0].value);
        c.emit('declared', {txn: txn.toString('hex')});
        send_data();
    } else if (delivery === discharge) {
        const s = delivery.remote_state;
        c.emit('discharged', {outcome: state_of(delivery),
            error: c.condition(s && s.error)});
        connection.finish({answered: answered});
    }
});
out.on('sendable', send_data);
out.on('settled', function (context) {
    answered++;
    c.emit('answered', {index: context.delivery.index, state: state_of(context.delivery)});
    if (answered === opts.count) {
        discharge = ctrl.send(discharge_message(txn, opts.fail), undefined, 0);
    }
});
