"""Where Shar shards are: a local folder or an S3 prefix (``s3://bucket/prefix``), listed here and read by lhotse's
own readers (``CutSet.from_shar(fields=...)``; an ``s3://`` shard opened through ``smart_open``, boto3 underneath).
One of the corpora part's modules.

* S3: the endpoint and credentials come from the environment only, as boto3 reads them (``AWS_ENDPOINT_URL`` or
  ``AWS_ENDPOINT_URL_S3`` for an S3-compatible server, ``AWS_REGION`` for Amazon S3; ``AWS_ACCESS_KEY_ID`` and
  ``AWS_SECRET_ACCESS_KEY``, or ``AWS_PROFILE``), never from a file of the project. A location without them, a bucket
  that does not exist, a prefix or folder without shards: one DataError naming it, before any work.
* A split is its pairs of ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar`` (:func:`split_shards`).
* A shard that cannot be read (a tar cut short, a read that fails) is read again (:data:`TRIES` times in all), then
  skipped whole with one warning line naming it and the count so far (:class:`ReadShards`).
"""

from __future__ import annotations

import os
import queue
import re
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar


from utils.data.corpus import DataError

URL = "s3://"
SHARD = re.compile(r"(cuts|recording)\.(\d{6})\.(jsonl\.gz|tar)$")
TRIES, PAUSE_S = 3, 0.5
"""A shard is read at most ``TRIES`` times, ``PAUSE_S * try`` seconds apart, before it is skipped."""
READ_ERRORS = (OSError, EOFError, ValueError, KeyError, tarfile.TarError)
"""What a shard that cannot be read raises in lhotse's readers (a local file, or S3 through smart_open and boto3)."""


def is_url(location: str) -> bool:
    """``location`` is an ``s3://`` URL (else a local folder)."""
    return str(location).startswith(URL)


def joined(location: str, name: str) -> str:
    """``name`` under the folder or S3 prefix ``location`` (``location/name``, one ``/`` between them): the one join of
    a location and a name in this part (a split under a Shar root, a shard in a split)."""
    return f"{str(location).rstrip('/')}/{name}"


def s3_errors() -> tuple[type[Exception], ...]:
    """botocore's errors (``BotoCoreError``, ``ClientError``), imported on first use as :func:`_boto3` is."""
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only shards on S3 need it

    return BotoCoreError, ClientError


def read_errors() -> tuple[type[Exception], ...]:
    """What reading a shard may raise: :data:`READ_ERRORS`, and botocore's where S3 is in use (imported)."""
    return READ_ERRORS + (s3_errors() if "botocore.exceptions" in sys.modules else ())


def _boto3() -> Any:
    """The boto3 package, imported on first use (a fraction of a second): only shards on S3 need it."""
    import boto3  # the runs on local folders never load it

    return boto3


def _smart_open() -> Any:
    """lhotse's ``SmartOpen`` (how its readers open a URL), imported on first use (lhotse takes seconds)."""
    from lhotse.utils import SmartOpen  # only shards on S3 need it

    return SmartOpen


CLIENT_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION")
"""The environment's S3 settings a client is made of (another value: another client)."""
_clients: dict[tuple, Any] = {}


def s3_client(url: str) -> Any:
    """The boto3 S3 client of the environment's settings (one per process and settings, made on first use; lhotse's
    readers open ``s3://`` shards with it: ``SmartOpen.setup``, as lhotse advises, not a client per file). DataError
    naming ``url``: no credentials, or neither an endpoint (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``) nor a
    region (``AWS_REGION``, a profile's)."""
    key = tuple(os.environ.get(name) for name in CLIENT_KEYS)
    if key in _clients:
        return _clients[key]
    session = _boto3().Session()
    if session.get_credentials() is None:
        raise DataError(f"{url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) "
                        "in the environment of every process")
    if not (os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or session.region_name):
        raise DataError(f"{url}: no S3 endpoint: set AWS_ENDPOINT_URL (an S3-compatible server) or AWS_REGION (Amazon "
                        "S3) in the environment of every process")
    _clients[key] = client = session.client("s3")
    _smart_open().setup(transport_params={"client": client})
    return client


def bucket_key(url: str) -> tuple[str, str]:
    """``(bucket, key prefix)`` of ``s3://bucket/prefix`` (the prefix without its trailing ``/``). DataError: no
    bucket named."""
    bucket, _, key = url[len(URL):].partition("/")
    if not bucket:
        raise DataError(f"{url}: no bucket named (s3://BUCKET/PREFIX)")
    return bucket, key.strip("/")


def s3_failure(url: str, err: Exception) -> DataError:
    """The one-line DataError of a failed S3 request on ``url``: the bucket missing, access refused, no endpoint."""
    code = err.response.get("Error", {}).get("Code", "") if isinstance(err, s3_errors()[1]) else ""
    if code in ("NoSuchBucket", "404"):
        return DataError(f"{url}: the bucket '{bucket_key(url)[0]}' does not exist (at the endpoint of "
                         "AWS_ENDPOINT_URL, else Amazon S3)")
    return DataError(f"{url}: {type(err).__name__}: {err}")


def listed(location: str) -> list[str]:
    """The names of the files directly in the folder or S3 prefix ``location`` (sorted). DataError: an S3 location
    without credentials or endpoint, a bucket that does not exist, a request refused."""
    if not is_url(location):
        folder = Path(location)
        return sorted(path.name for path in folder.iterdir() if path.is_file()) if folder.is_dir() else []
    client, (bucket, key) = s3_client(location), bucket_key(location)
    prefix = f"{key}/" if key else ""
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/")
        return sorted(item["Key"][len(prefix):] for page in pages for item in page.get("Contents", []))
    except s3_errors() as err:
        raise s3_failure(location, err) from None


def split_shards(location: str) -> list[tuple[str, str]]:
    """``(cuts file, recording tar)`` of each shard of the Shar split at ``location`` (a folder or an S3 prefix), in
    shard order, each a path or ``s3://`` URL. DataError naming ``location``: no cuts files, a cuts file without its
    recording tar; what :func:`listed` raises."""
    found: dict[str, dict[str, str]] = {}
    for name in listed(location):
        if match := SHARD.fullmatch(name):
            found.setdefault(match.group(2), {})[match.group(1)] = joined(location, name)
    if not any("cuts" in shard for shard in found.values()):
        raise DataError(f"{location}: no cuts.*.jsonl.gz: not a Shar split (python -m scripts.make_shards writes "
                        "FOLDER/train and FOLDER/val; --dataset-path FOLDER or s3://BUCKET/PREFIX)")
    alone = [shard["cuts"] for shard in found.values() if "recording" not in shard]
    if alone:
        raise DataError(f"{alone[0]}: no recording tar beside it ({len(alone)} cuts file(s) without one)")
    return [(found[n]["cuts"], found[n]["recording"]) for n in sorted(found) if "cuts" in found[n]]


def upload(folder: Path, url: str) -> int:
    """Copy every file under ``folder`` to the S3 prefix ``url`` (``folder/a/b`` -> ``url/a/b``); the files copied.
    DataError: what :func:`s3_client` raises, a bucket that does not exist, a request refused."""
    client, (bucket, key) = s3_client(url), bucket_key(url)
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    try:
        for path in files:
            client.upload_file(str(path), bucket, "/".join(filter(None, [key, *path.relative_to(folder).parts])))
    except s3_errors() as err:
        raise s3_failure(url, err) from None
    except _boto3().exceptions.S3UploadFailedError as err:  # boto3's wrapper of a refused upload
        raise DataError(f"{url}: {err}") from None
    return len(files)


def check_bucket(url: str) -> None:
    """DataError: the bucket of ``url`` does not exist or cannot be reached (what :func:`s3_client` raises too)."""
    client, (bucket, _) = s3_client(url), bucket_key(url)
    try:
        client.head_bucket(Bucket=bucket)
    except s3_errors() as err:
        raise s3_failure(url, err) from None


class ReadShards:
    """The cuts of ``shards`` (:func:`split_shards`' pairs), shard after shard, those ``keep`` accepts: each shard read
    whole by lhotse's ``CutSet.from_shar(fields=...)``, its audio in memory, before its cuts are given. A shard that
    raises one of :func:`read_errors` is read again, :data:`TRIES` times in all, then skipped: ``say`` (where given)
    receives one line naming its tar and the shards skipped so far (``skipped``). Iterable again (lhotse's lazy
    ``CutSet`` of it is read at each epoch)."""

    def __init__(self, shards: list[tuple[str, str]], keep: Callable[[Any], bool], from_shar: Callable[..., Any],
                 say: Optional[Callable[[str], None]] = None):
        self.shards, self.keep, self.from_shar, self.say = shards, keep, from_shar, say
        self.skipped = 0

    def read(self, cuts: str, recording: str) -> Optional[list[Any]]:
        """The cuts of one shard, read whole; None after :data:`TRIES` failures (said, and counted)."""
        for attempt in range(1, TRIES + 1):
            try:
                return [cut for cut in self.from_shar(fields={"cuts": [cuts], "recording": [recording]})
                        if self.keep(cut)]
            except read_errors() as err:
                error = err
                if attempt < TRIES:
                    time.sleep(PAUSE_S * attempt)
        self.skipped += 1
        if self.say is not None:
            self.say(f"warning: shard {recording} could not be read in {TRIES} tries ({type(error).__name__}: "
                     f"{error}): its cuts skipped ({self.skipped} shard(s) skipped so far)")
        return None

    def __iter__(self) -> Iterator[Any]:
        for cuts, recording in self.shards:
            yield from self.read(cuts, recording) or []


T = TypeVar("T")
_END = object()


def _hand(ready: queue.Queue, stop: threading.Event, entry: tuple) -> bool:
    """Put ``entry`` in ``ready`` once there is room; False once ``stop`` is set (the caller is gone)."""
    while not stop.is_set():
        try:
            ready.put(entry, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _draw(items: Iterable[Any], ready: queue.Queue, stop: threading.Event) -> None:
    """``(item, None)`` for each of ``items``, then ``(_END, the exception they raised or None)``, into ``ready``."""
    try:
        for item in items:
            if not _hand(ready, stop, (item, None)):
                return
    except Exception as err:  # raised in the caller's thread, in its place among the items
        _hand(ready, stop, (_END, err))
        return
    _hand(ready, stop, (_END, None))


def read_ahead(items: Iterable[T], size: int) -> Iterator[T]:
    """``items`` in their order, drawn by a thread of their own (``shard-read-ahead``) at most ``size`` ahead of the
    caller: the shards' reads (their tars, from a disk or an S3 store) overlap the training steps instead of stalling
    the loop that asks the sampler for its next batch. An exception ``items`` raise is raised here, where it falls in
    their order; closing the generator (an epoch left early) stops the thread at its next item."""
    ready: queue.Queue = queue.Queue(maxsize=max(1, size))
    stop = threading.Event()
    threading.Thread(target=_draw, args=(items, ready, stop), name="shard-read-ahead", daemon=True).start()
    try:
        while True:
            item, err = ready.get()
            if item is _END:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        stop.set()


def warn(line: str) -> None:
    """``line`` on stderr, at once (the run log's warnings are lines there)."""
    print(line, file=sys.stderr, flush=True)
