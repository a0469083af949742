"""The cloud platforms' environment, read in one place: the launch options a platform gives a node (Kubeflow, SkyPilot,
Vertex AI, PAI), the folders of a run (Vertex AI's, SageMaker's) and SageMaker's hyperparameters. Azure ML and Ray
Train start the processes with torchrun's variables, which ``utils.launch`` reads. Sources:
https://pytorch.org/docs/stable/elastic/run.html (``PET_<OPTION>``), the documentation of Kubeflow Trainer and the
Training Operator, SkyPilot (``SKYPILOT_*``), Vertex AI (``AIP_*``) and SageMaker's training toolkit."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Optional

from utils.launch import check_not_launched

# Where platform_topology finds node 0's host, for multiproc.py's error when none gave it.
MASTER_ADDR_VARIABLES = ("PET_MASTER_ADDR (Kubeflow), SKYPILOT_NODE_IPS (SkyPilot), or MASTER_ADDR beside WORLD_SIZE "
                         "and RANK (a per-node launcher)")


def check_process_rank(environ: Mapping[str, str]) -> None:
    """Refuse a Kubeflow PyTorchJob pod that runs ``train.py`` without a launcher: its ``RANK`` is the pod's index
    beside the processes' ``WORLD_SIZE`` (no ``LOCAL_RANK``, ``PET_NPROC_PER_NODE`` > 1). Raises ValueError: a pod's
    index taken for a process's rank, naming the command that starts the processes."""
    per_node = environ.get("PET_NPROC_PER_NODE", "").strip()
    if "LOCAL_RANK" in environ or not (per_node.isdigit() and int(per_node) > 1):
        return
    try:
        rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    except (KeyError, ValueError):  # not torchrun's variables, or malformed: detect_launcher_env names them
        return
    raise ValueError(f"RANK={rank} and WORLD_SIZE={world_size} without LOCAL_RANK, and PET_NPROC_PER_NODE="
                     f"{per_node}: RANK is the platform's node (pod) index, not a process's rank (Kubeflow's "
                     "PyTorchJob); start the job with python multiproc.py train.py ... (it reads PET_* and "
                     f"starts {per_node} processes per node) or torchrun")


def platform_topology(environ) -> tuple[str, dict]:
    """The launch options a platform gives this node: ``(platform, {option: value})``, values still strings, from the
    first present of: torchrun's ``PET_<OPTION>`` (Kubeflow; under them a PyTorchJob's ``MASTER_ADDR``/``MASTER_PORT``);
    SkyPilot's ``SKYPILOT_*`` and ``MASTER_PORT``; a per-node launcher's ``WORLD_SIZE`` nodes, this one ``RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT`` (Vertex AI, PAI); else ``("", {})``. Raises ValueError: ``LOCAL_RANK`` set without
    ``PET_``/SkyPilot variables: a launcher started this process (:func:`utils.launch.check_not_launched`)."""
    def present(*names):
        return {name: environ[name].strip() for name in names if environ.get(name, "").strip()}

    pet = present("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
    plain = present("MASTER_ADDR", "MASTER_PORT")
    if pet:
        return "torchrun's PET_* variables (Kubeflow)", {name.lower().removeprefix("pet_"): value
                                                         for name, value in {**plain, **pet}.items()}
    if present("SKYPILOT_NODE_RANK"):
        sky = present("SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK", "SKYPILOT_NUM_GPUS_PER_NODE", "SKYPILOT_NODE_IPS",
                      "MASTER_PORT")
        found = {option: sky[name] for option, name in (("nnodes", "SKYPILOT_NUM_NODES"),
                                                        ("node_rank", "SKYPILOT_NODE_RANK"),
                                                        ("master_port", "MASTER_PORT")) if name in sky}
        if sky.get("SKYPILOT_NUM_GPUS_PER_NODE", "0") != "0":
            found["nproc_per_node"] = sky["SKYPILOT_NUM_GPUS_PER_NODE"]
        if "SKYPILOT_NODE_IPS" in sky:
            found["master_addr"] = sky["SKYPILOT_NODE_IPS"].split()[0]
        return "SkyPilot's SKYPILOT_* variables", found
    check_not_launched(environ, "torchrun, Azure ML")
    ranks = present("RANK", "WORLD_SIZE")
    if "RANK" in ranks and "WORLD_SIZE" in ranks:
        found = {"nnodes": ranks["WORLD_SIZE"], "node_rank": ranks["RANK"], **{k.lower(): v for k, v in plain.items()}}
        return "a per-node launcher's WORLD_SIZE (nodes) and RANK (this node)", found
    return "", {}


def fill_launch_options(args, argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """Fill the options of ``multiproc.py`` (``args``, in place) that its command line ``argv`` left out from
    :func:`platform_topology`; returns the platform read (``""``: none). One node keeps a free port of its own. Raises
    ValueError: a value that is not a whole number, or :func:`platform_topology`'s."""
    platform, found = platform_topology(environ)
    script_at = argv.index(args.script) if args.script in argv else len(argv)
    given = {arg.split("=")[0].lstrip("-").replace("-", "_") for arg in argv[:script_at] if arg.startswith("--")}
    for option in ("nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port"):
        value = found.get(option)
        if option in given or value is None or (option.startswith("master_") and args.nnodes == 1):
            continue
        if option == "master_addr":
            args.master_addr = value
        elif option == "nproc_per_node" and value in ("auto", "gpu", "cpu"):
            args.nproc_per_node = None if value != "cpu" else 2
        else:
            try:
                setattr(args, option, int(value))
            except ValueError:
                raise ValueError(f"{platform}: {value!r} for --{option.replace('_', '-')} is not a whole "
                                 "number") from None
    return platform


SAGEMAKER_CHECKPOINTS = "/opt/ml/checkpoints"  # SageMaker's checkpoint_local_path, synced with checkpoint_s3_uri
# train.py --help's defaults of --output-dir and --dataset-path
OUTPUT_DIR_DEFAULT = f"Vertex AI's AIP_CHECKPOINT_DIR, SageMaker's {SAGEMAKER_CHECKPOINTS}, else output"
DATASET_PATH_DEFAULT = "SageMaker's SM_CHANNEL_TRAINING when set"


GCS_MOUNT = "/gcs"  # where Vertex AI mounts Cloud Storage (FUSE): all buckets, or each at /gcs/<bucket>


def gcs_fuse_path(uri: str, variable: str) -> str:
    """Vertex AI's ``gs://bucket/path`` as the job sees it (``/gcs/bucket/path``, Cloud Storage FUSE); others as is.
    Raises ValueError: a ``gs://`` URI where nothing is mounted at :data:`GCS_MOUNT` (the files would stay on this
    machine), naming ``variable``, the environment variable that gave it."""
    if not uri.startswith("gs://"):
        return uri
    path = f"{GCS_MOUNT}/{uri[len('gs://'):]}"
    if not any(os.path.ismount(mount) for mount in (GCS_MOUNT, "/".join(path.split("/")[:3]))):
        raise ValueError(f"{variable}={uri}: no Cloud Storage is mounted at {GCS_MOUNT} here (Vertex AI mounts it), so "
                         f"{path} would be a folder of this machine; unset {variable}"
                         + (" or pass --output-dir" if variable == "AIP_CHECKPOINT_DIR" else ""))
    return path


def default_output_dir(environ: Mapping[str, str]) -> str:
    """The output folder of a run without ``--output-dir`` (:data:`OUTPUT_DIR_DEFAULT`). Raises ValueError: see
    :func:`gcs_fuse_path`."""
    if environ.get("AIP_CHECKPOINT_DIR", "").strip():
        return gcs_fuse_path(environ["AIP_CHECKPOINT_DIR"].strip(), "AIP_CHECKPOINT_DIR")
    if environ.get("SM_TRAINING_ENV") or environ.get("SM_CURRENT_HOST"):  # a SageMaker training job
        return SAGEMAKER_CHECKPOINTS
    return "output"


def default_dataset_path(environ: Mapping[str, str]) -> Optional[str]:
    """SageMaker's ``training`` channel (``SM_CHANNEL_TRAINING``) for a run without ``--dataset-path``, or ``None``.
    Raises ValueError: the variable names no folder (a channel the job did not download, a mistyped path)."""
    path = environ.get("SM_CHANNEL_TRAINING", "").strip()
    if path and not os.path.isdir(path):
        raise ValueError(f"SM_CHANNEL_TRAINING={path}: no such folder (SageMaker's training channel: check the job's "
                         "input channels), or pass --dataset-path")
    return path or None


def tensorboard_dir(environ: Mapping[str, str], output_dir: str) -> str:
    """TensorBoard's folder: Vertex AI's ``AIP_TENSORBOARD_LOG_DIR`` when set, else ``<output_dir>/tensorboard``. Raises
    ValueError: see :func:`gcs_fuse_path`."""
    given = environ.get("AIP_TENSORBOARD_LOG_DIR", "").strip()
    return gcs_fuse_path(given, "AIP_TENSORBOARD_LOG_DIR") if given else f"{output_dir.rstrip('/')}/tensorboard"


FLAG_VALUES = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False, "": False}


def hyperparameter_argv(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """SageMaker's hyperparameter style made into this script's: ``--section.key value`` and ``--section.key=value``
    become ``--set section.key=value``; a flag in ``flags`` followed by a boolean word (``True``, ``0``...) is kept or
    dropped by it."""
    out, i = [], 0
    while i < len(argv):
        arg, following = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        dotted = "." in name and not name.startswith(".")
        if dotted and "=" in arg:
            out += ["--set", arg[2:]]
        elif dotted and following is not None:
            out += ["--set", f"{name}={following}"]
            i += 1
        elif arg in flags and following is not None and following.strip().lower() in FLAG_VALUES:
            out += [arg] if FLAG_VALUES[following.strip().lower()] else []
            i += 1
        else:
            out.append(arg)  # also a dotted name without a value: argparse names it
        i += 1
    return out
