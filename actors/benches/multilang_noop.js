// A no-op MultiLang record processor for the P10 benchmark, written with the npm
// aws-kcl client (its directory is the first argument): it answers every action at
// once and checkpoints only where the protocol requires it (shardEnded).
'use strict';

var kcl = require(process.argv[2]);

kcl({
  initialize: function (input, done) { done(); },
  processRecords: function (input, done) { done(); },
  leaseLost: function (input, done) { done(); },
  shardEnded: function (input, done) {
    input.checkpointer.checkpoint(function () { done(); });
  },
  shutdownRequested: function (input, done) { done(); }
}).run();
