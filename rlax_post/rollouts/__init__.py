"""Rollout queue: a TransferQueue-style store between samplers and learners (the AsyncFlow paper).

Rows and fields. Each sample is a row, identified by a string `row_id`, holding named fields: numpy arrays
(any non-object dtype and shape), numpy scalars, python `bool`/`int`/`float`/`str`/`bytes`/`None` (e.g.
prompt tokens, response tokens, logprobs, token versions, reward, episode info). A row is created by its
first `put` and fields may be added by later puts as they become ready (tokens first, reward later); each
field is written once (a second write is a `ValueError`), so rows are immutable per field.

Groups. Every row belongs to a group (`group_id`, `group_size` = rows in the group: the n samples of a
prompt, or all nodes of a rollout tree); `group_size` must agree across the group's puts.

Readiness. `get_groups(consumer, n, required=...)` hands out only complete groups: `group_size` rows, each
holding every `required` field. It blocks until `n` such groups that `consumer` has not consumed exist and
returns the oldest ones, ordered by the commit of the write that completed them; rows inside a group are
ordered by creation (`Row.seq`).

Consumption status. Consumers are named at construction; each consumer gets every group exactly once. A
`get_groups` call records a `tag` (e.g. the learner step) with the groups it consumed; `rollback(consumer,
after_tag)` un-consumes the groups consumed with a larger tag, so a learner resumed from the checkpoint of
step `after_tag` trains on them again. `consumed_tags` shows the status; `depth(consumer)` counts rows the
consumer has not consumed (complete or not).

Backpressure. A `put` that creates a new row blocks while the queue holds `capacity` rows that some
registered consumer has not consumed (`TimeoutError` after `timeout_s`); puts that add fields to existing
rows never block. `capacity` must cover the groups being filled concurrently (a group larger than
`capacity` is rejected; many half-filled groups can otherwise fill the queue and stall).

Backends. `MemoryQueue`: threads of one process, exact. `FileQueue`: processes or hosts sharing a directory
(local path or bucket URL through `etils.epath`), with this layout:

    <dir>/shards/<writer_id>/<seq:012d>.rec             one shard per flush of one writer; one record per put,
                                                        flax-msgpack {"version", "row_id", "group_id",
                                                        "group_size", "fields"}, framed with its length and
                                                        CRC-32, after the shard's publish stamp (see
                                                        `_records.py`: the file is the payload + 28 bytes + 8
                                                        per record); written under a temporary name, then
                                                        renamed, so readers (which list only this name
                                                        pattern) never see a partial shard; a restarted writer
                                                        continues numbering after its existing shards. Readers
                                                        merge shards by stamp, so a reopened queue hands groups
                                                        out in the order they were published, not by writer.
                                                        (`.array_record` shards of older runs are still read.)
    <dir>/consumers/<consumer>.jsonl                    consumption log, one line per `get_groups`:
                                                        {"tag": t, "groups": [[group_id, rows], ...]},
                                                        appended and fsynced; `rollback` and `release` rewrite
                                                        it atomically (temporary file + rename).
    <dir>/consumers/<consumer>.count                    {"rows_consumed", "rows_seen", "shards_seen":
                                                        {writer_id: highest shard seq read}}, written
                                                        atomically by the consumer; writers in other
                                                        processes use it for (approximate) backpressure.
    <dir>/released.json                                 the released groups (compact id runs), their rows and
                                                        the released tag; see below.
    <dir>/consumers/<consumer>.released                 the tags `consumer` consumed released groups with, one
                                                        line per release (compact id runs).

Disk use. A shard is about its payload (a group of 4 rows of 100 tokens with logprobs: 3.7 KB). `release(t)`
(the runtime calls it after each checkpoint) bounds the directory: one `release` call later (so a learner that
dies before checkpoint t commits can still roll back to the previous checkpoint) the groups every consumer
consumed with a tag <= t are recorded in released.json, dropped from the consumption logs of the consumers the
releasing object drives, and every shard holding only released groups is deleted (each writer's newest shard
stays, so a restarted writer never reuses a number). Restarted samplers (`written_group_ids`), resumed learners
(`seen_group_ids`, `consumed_tags`) and the counts still see the released groups. What stays on disk is the
unreleased groups' shards plus small files; only the `.released` history grows with the run, by about 25 bytes
per learner step (tested over 200 steps in tests/test_rollouts_disk.py).

Nothing committed (a published shard) is lost and no group is handed out twice to one consumer, also across a
consumer restart (a new `FileQueue` on the same directory reloads the log). See `FileQueue` for visibility
and the backpressure approximation.
"""

from rlax_post.rollouts._admission import Admission
from rlax_post.rollouts._admission import admission_limit
from rlax_post.rollouts._admission import FileAdmission
from rlax_post.rollouts._admission import group_staleness
from rlax_post.rollouts._admission import is_stale
from rlax_post.rollouts._admission import MemoryAdmission
from rlax_post.rollouts._files import FileQueue
from rlax_post.rollouts._queue import Group
from rlax_post.rollouts._queue import GroupReleased
from rlax_post.rollouts._queue import MemoryQueue
from rlax_post.rollouts._queue import RolloutQueue
from rlax_post.rollouts._queue import Row

__all__ = (
    'Admission',
    'admission_limit',
    'FileAdmission',
    'group_staleness',
    'is_stale',
    'MemoryAdmission',
    'FileQueue',
    'Group',
    'GroupReleased',
    'MemoryQueue',
    'RolloutQueue',
    'Row',
)
