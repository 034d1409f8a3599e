// Package batch is OpenAI's Files and Batches APIs on JetStream: durable,
// shared by every gateway, and exactly once across crashes.
//
// State, all in JetStream (the durable store tokenbus already has; Redis
// keeps no blobs and its persistence is optional):
//   - files in the Object Store bucket TOKENBUS_FILES, chunked, so that
//     no file is ever held in memory whole (uploads stream in, content
//     streams out, output files are written line by line);
//   - one record per batch in the Key-Value bucket TOKENBUS_BATCHES,
//     changed only with the revision it was read at, so that gateways and
//     runners never overwrite each other's changes;
//   - the lines not yet answered in the work-queue stream TOKENBUS_BATCH
//     (subject tokenbus.v1.batch.work.<batch-id>, one durable consumer per
//     batch, shared by every runner);
//   - the answered lines in TOKENBUS_BATCH_RESULTS (subjects
//     tokenbus.v1.batch.result.<batch-id>.ok and .err), each published
//     with Nats-Msg-Id <batch-id>/<custom_id>;
//   - an entry per file and per batch in the Key-Value bucket
//     TOKENBUS_INDEX, keyed by tenant (index.go), from which a tenant's
//     listings and quota counts are read without touching other tenants'.
//
// Each of these has its own MaxBytes (discard new), so that one filling up
// leaves the others working; deletes purge and write nothing, so they work
// on a full store. A tenant's quotas (Config.Quotas: file bytes and count,
// batches not yet ended) are checked before writing (quota.go).
//
// A Runner (one per gateway that runs batches) validates a new batch's
// input file and queues its lines, takes lines of every running batch
// (its room shared equally between tenants, then between a tenant's
// batches; bounded per batch and in all, and only while the model's
// workers have free slots), sends each through the bus with the client package at
// low priority, records its result, then acks it. A line whose runner dies
// before the ack runs again after AckWait; its result is stored once (the
// de-duplication window), and finalising keeps one result per custom_id
// whatever slipped through. When every line has a result, one runner (a
// lease in the record) writes the output and error files and ends the
// batch. docs/batch.md tells the whole design and what each crash does.
//
// Tokenbus imports: client, schemas.
package batch
