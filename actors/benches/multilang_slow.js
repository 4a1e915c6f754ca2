// A slow MultiLang record processor for the P15 benchmark (actors/benches/lanes.rs),
// written with the npm aws-kcl client (its directory is the first argument): it waits
// 10 ms per record (the second argument changes it) with setTimeout, an async wait
// such as a call to another service, one record after another, and checkpoints the
// last record of each batch, as the client's sample consumer does. It checkpoints in
// shardEnded and shutdownRequested too.
//
// Record i of a batch is done at start + (i + 1) * wait, a deadline rather than a
// fresh 10 ms timer per record, so the timer's millisecond grain is paid once per
// batch, not once per record (the Rust processor of the same bench waits the same way).
'use strict';

var kcl = require(process.argv[2]);
var waitMs = parseFloat(process.argv[3] || '10');

function now() {
  var t = process.hrtime();
  return t[0] * 1e3 + t[1] / 1e6;
}

kcl({
  initialize: function (input, done) { done(); },
  processRecords: function (input, done) {
    var records = input.records || [];
    if (records.length === 0) {
      done();
      return;
    }
    var last = records[records.length - 1].sequenceNumber;
    var start = now();
    var i = 0;
    function next() {
      if (i === records.length) {
        input.checkpointer.checkpoint(last, function (err) {
          if (err) {
            process.stderr.write('checkpoint failed: ' + err + '\n');
          }
          done();
        });
        return;
      }
      i += 1;
      setTimeout(next, Math.max(0, start + i * waitMs - now()));
    }
    next();
  },
  leaseLost: function (input, done) { done(); },
  shardEnded: function (input, done) {
    input.checkpointer.checkpoint(function () { done(); });
  },
  shutdownRequested: function (input, done) {
    input.checkpointer.checkpoint(function () { done(); });
  }
}).run();
