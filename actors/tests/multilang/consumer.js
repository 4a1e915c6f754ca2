// A MultiLang record processor written with the npm `aws-kcl` package, as its sample
// consumer (samples/basic_sample/consumer/sample_kcl_app.js) is: it checkpoints the
// last record of each batch, and checkpoints in shardEnded and shutdownRequested.
// Each record is appended to the file named by the first argument as `shardId
// partitionKey data`, so the test can check what was processed. A second argument N
// makes it exit (status 3) at the N-th record it sees, once per output file.
'use strict';

var fs = require('fs');
var kcl = require(process.env.FLOTILLA_TEST_AWS_KCL);

var out = process.argv[2];
var crashAt = parseInt(process.argv[3] || '0', 10);
// Crash once per run: a restarted child finds the marker and goes on.
if (crashAt > 0 && fs.existsSync(out + '.crashed')) {
  crashAt = 0;
}
var seen = 0;

function recordProcessor() {
  var shardId;
  return {
    initialize: function (input, done) {
      shardId = input.shardId;
      done();
    },
    processRecords: function (input, done) {
      var records = input.records || [];
      var lines = '';
      var last;
      for (var i = 0; i < records.length; ++i) {
        var record = records[i];
        lines += shardId + ' ' + record.partitionKey + ' ' +
          Buffer.from(record.data, 'base64').toString() + '\n';
        last = record.sequenceNumber;
        seen += 1;
        if (crashAt > 0 && seen >= crashAt) {
          fs.appendFileSync(out, lines);
          fs.writeFileSync(out + '.crashed', '');
          process.exit(3);
        }
      }
      fs.appendFileSync(out, lines);
      if (!last) {
        done();
        return;
      }
      input.checkpointer.checkpoint(last, function (err) {
        if (err) {
          process.stderr.write('checkpoint failed: ' + err + '\n');
        }
        done();
      });
    },
    leaseLost: function (input, done) {
      done();
    },
    shardEnded: function (input, done) {
      input.checkpointer.checkpoint(function (err) {
        if (err) {
          process.stderr.write('shard end checkpoint failed: ' + err + '\n');
        }
        done();
      });
    },
    shutdownRequested: function (input, done) {
      input.checkpointer.checkpoint(function (err) {
        done();
      });
    }
  };
}

kcl(recordProcessor()).run();
