"""What managed training platforms hand a training script besides its rank: folders and an argument style.

Rank, local rank and world size are read by ``distributed.detect_launcher_env`` (and the launcher's options by
``multiproc.platform_topology``); this module covers the rest, in one documented order per value:

* the output folder (checkpoints, metrics, ``--resume auto``): ``--output-dir``; else Vertex AI's
  ``AIP_CHECKPOINT_DIR``; else, on SageMaker, ``/opt/ml/checkpoints`` (SageMaker copies that folder to and from the
  estimator's ``checkpoint_s3_uri``, so a restarted spot job finds its checkpoints); else ``output``.
* the corpus: ``--dataset-path``; else SageMaker's ``SM_CHANNEL_TRAINING`` (the folder of the input channel named
  ``training``); else ``data.dataset_path`` of the config.
* TensorBoard's folder: Vertex AI's ``AIP_TENSORBOARD_LOG_DIR``; else ``<output folder>/tensorboard``.

Vertex AI gives ``gs://bucket/path`` URIs; the job sees the bucket under ``/gcs/bucket/path`` (Cloud Storage FUSE),
which is where this project writes. SageMaker passes hyperparameters as ``--name value``: :func:`hyperparameter_argv`
turns ``--train.lr 1e-4`` into ``--set train.lr=1e-4`` and ``--tiny True`` into ``--tiny``.

Sources: Vertex AI's "Prepare training code" (environment variables of custom training), SageMaker's training
toolkit (``SM_CHANNEL_<NAME>``, checkpoints in ``/opt/ml/checkpoints``, hyperparameters as arguments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

SAGEMAKER_CHECKPOINTS = "/opt/ml/checkpoints"
"""SageMaker's default ``checkpoint_local_path``: synced with ``checkpoint_s3_uri`` during and after a job."""


def on_sagemaker(environ: Mapping[str, str]) -> bool:
    """Whether this process runs in a SageMaker training job (its toolkit sets ``SM_TRAINING_ENV`` and
    ``SM_CURRENT_HOST``)."""
    return bool(environ.get("SM_TRAINING_ENV") or environ.get("SM_CURRENT_HOST"))


def gcs_fuse_path(uri: str) -> str:
    """``gs://bucket/path`` as the job's file system shows it (``/gcs/bucket/path``); other paths unchanged."""
    return "/gcs/" + uri[len("gs://"):] if uri.startswith("gs://") else uri


def default_output_dir(environ: Mapping[str, str]) -> str:
    """The output folder of a run started without ``--output-dir`` (the order in the module's docstring)."""
    if environ.get("AIP_CHECKPOINT_DIR", "").strip():
        return gcs_fuse_path(environ["AIP_CHECKPOINT_DIR"].strip())
    if on_sagemaker(environ):
        return SAGEMAKER_CHECKPOINTS
    return "output"


def default_dataset_path(environ: Mapping[str, str]) -> Optional[str]:
    """SageMaker's ``training`` channel (``SM_CHANNEL_TRAINING``) for a run started without ``--dataset-path``, or
    ``None`` (then the config's ``data.dataset_path``)."""
    return environ.get("SM_CHANNEL_TRAINING", "").strip() or None


def tensorboard_dir(environ: Mapping[str, str], output_dir: str) -> str:
    """Where TensorBoard's event files go: Vertex AI's ``AIP_TENSORBOARD_LOG_DIR`` when set (its TensorBoard reads
    them from there), else ``<output_dir>/tensorboard``."""
    given = environ.get("AIP_TENSORBOARD_LOG_DIR", "").strip()
    return gcs_fuse_path(given) if given else f"{output_dir.rstrip('/')}/tensorboard"


FLAG_VALUES = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False, "": False}


def hyperparameter_argv(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """SageMaker's hyperparameter style made into this script's: ``--section.key value`` and
    ``--section.key=value`` become ``--set section.key=value``; a flag in ``flags`` (e.g. ``--tiny``) followed by
    a boolean word (``True``, ``false``, ``1``...) is kept or dropped by it. Everything else is returned as given.
    """
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        if "." in name and not name.startswith("."):
            if "=" in arg:
                out += ["--set", arg[2:]]
            elif i + 1 < len(argv):
                out += ["--set", f"{name}={argv[i + 1]}"]
                i += 1
            else:
                out.append(arg)  # no value: argparse names it
        elif arg in flags and i + 1 < len(argv) and argv[i + 1].strip().lower() in FLAG_VALUES:
            if FLAG_VALUES[argv[i + 1].strip().lower()]:
                out.append(arg)
            i += 1
        else:
            out.append(arg)
        i += 1
    return out
