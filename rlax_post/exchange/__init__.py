"""Versioned parameter exchange between a learner and its samplers, over orbax checkpoints.

A `ParamPublisher` (the learner) writes params versions; `ParamSubscriber`s (samplers, evaluators; in this
process or others, on other hosts, on other meshes) read the newest one. `LocalParams` is the in-memory
equivalent for threads of one process. Both readers satisfy `ParamSource`.

Layout on disk::

  <dir>/<version>/                     one complete version (int >= 0, strictly increasing)
    commit_success.txt                 orbax's commit marker, written last
    params/                            the params pytree (orbax StandardSave, OCDBT)
    meta/                              the JSON `meta` dict
  <dir>/<version>.orbax-checkpoint-tmp a version being written (never read)
  <dir>/leases/<version>.<reader_id>.<nonce>   a reader's lease: the wall-clock time it was taken

Publish ids. A learner resumed from an older checkpoint publishes the numbers of its lost versions again,
with other params. `Lineage` (`_lineage.py`) gives each learner life a publish id and keeps which publish of
each number is in the run's history; the learner publishes each version with its id in `meta["publish_id"]`,
and `restored_meta(version)` gives a reader the meta of the params it restored (read with them), so samplers
can put the id on their rows and the learner can drop rows of a publish that is not in its history.

Atomicity. A version is either complete or invisible (`is_complete(step_dir)`, also for other orbax step
directories such as the runtime's checkpoints). Orbax writes into a tmp directory and renames it when
done (local disks) or writes in place and adds `commit_success.txt` last (buckets); in both modes the marker
exists only in a finished version. Readers list only directories named `<int>` holding the marker (orbax's
commit-file finalization check), so tmp dirs, stray numeric dirs and half-written versions are never read.
A directory with the marker that cannot be read raises `ValueError` ("corrupt") instead of returning data.

Free space. Before writing version v to a local directory, `publish` (every process) checks that the
directory's filesystem has room for it, predicted from the newest complete version's bytes on disk (or, for
the first, a quarter of the params' raw bytes: `_space.py` says why), and raises `OSError` (ENOSPC) naming
the bytes needed and free before orbax writes a byte; a write that runs out of space anyway is reported the
same way when it is waited for (the next `publish`, `wait`, `close`). Bucket URLs are not checked. The
partial write such a publish leaves (orbax's `<version>.orbax-checkpoint-tmp`) is removed before the next
check (`remove_partial_writes`), so its bytes are not counted against the next version.

Asynchrony. `publish` returns once the params are copied to host memory; orbax writes them in a background
thread. `wait()` (or `close()`) blocks until all publishes are visible.

GC and leases. After each publish the publisher deletes complete versions older than the newest
`max_to_keep`, on a background thread. Deletion removes the commit marker first, so a version being deleted is
invisible at once. Before restoring version v a reader atomically writes `leases/<v>.<reader_id>.<nonce>`
(holding `time.time()`), re-checks that v is still complete, restores, and removes the lease. GC skips
versions with a lease younger than `lease_timeout_s` and removes older leases (their readers died). A reader
that still loses its version (it listed v just before GC deleted it, or its restore outlived its lease)
sees v vanish and `latest()`/`wait_for()` retry with the then-newest version; `restore(v)` raises
`ValueError` listing the available versions.

Processes and buckets. All paths are `etils.epath.Path`s (`as_path`): a local directory (made absolute) or a
bucket URL such as `gs://bucket/run/params` (kept as is). Readers re-list the directory on every call and never create
or delete versions, so any number of reader processes can follow one publisher process. Lease times are wall
clocks of different hosts: keep `lease_timeout_s` well above both the clock skew and the slowest restore.
Restores read only the shards each reader's own shardings need, so a reader may use a different mesh and
different `PartitionSpec`s than the publisher (resharding on restore), and different dtypes (cast on read).
"""

from rlax_post.exchange._lineage import Lineage
from rlax_post.exchange._lineage import loads_lineage
from rlax_post.exchange._lineage import UNKNOWN
from rlax_post.exchange._local import loaded_key
from rlax_post.exchange._local import LocalParams
from rlax_post.exchange._local import ParamSource
from rlax_post.exchange._publisher import ParamPublisher
from rlax_post.exchange._space import check_space
from rlax_post.exchange._space import FIRST_SAVE_FRACTION
from rlax_post.exchange._space import is_out_of_space
from rlax_post.exchange._space import out_of_space_error
from rlax_post.exchange._space import partial_writes
from rlax_post.exchange._space import predict
from rlax_post.exchange._space import Prediction
from rlax_post.exchange._space import remove_partial_writes
from rlax_post.exchange._space import wait_for_write
from rlax_post.exchange._store import as_path
from rlax_post.exchange._store import is_complete
from rlax_post.exchange._store import quiet_abandoned_io
from rlax_post.exchange._subscriber import ParamSubscriber

__all__ = ["Lineage", "loads_lineage", "UNKNOWN", "loaded_key", "LocalParams", "ParamPublisher", "ParamSource",
           "ParamSubscriber", "as_path", "is_complete", "quiet_abandoned_io", "check_space", "FIRST_SAVE_FRACTION",
           "is_out_of_space", "out_of_space_error", "partial_writes", "predict", "Prediction", "remove_partial_writes",
           "wait_for_write"]
