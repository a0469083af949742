"""The launch files of ``scripts/kubeflow/`` and ``scripts/skypilot/`` against the project: what a user relies on.
Fast: nothing is trained and no cluster is needed. That each file is a valid document of its platform is
``tests/test_launch_files.py``.

* Each file runs ``python multiproc.py ... train.py --config config.json`` with no topology option (the platform
  gives it), and sets no variable the platform gives each node (``PET_*``, ``MASTER_ADDR``, ...).
* Kubernetes: a grace period longer than ``--stop-timeout``, the output folder on a writable PersistentVolumeClaim,
  shared memory in RAM, the project's image with a GPU per process; SkyPilot: the output folder in a bucket mounted
  on every node.
* Credentials (the trackers', the object store's) reach every node from an optional Secret, where the project has
  the part that reads them, and no file writes one.

Without PyYAML these tests are skipped: ``pip install -r requirements-launch.txt``.
"""

import re
from pathlib import PurePosixPath

import pytest
from conftest import launch_command
from test_launch_files import LAUNCH_FILES, PROJECT, PYTORCHJOB, SKYPILOT, SLUG, TRAINJOB, kubernetes_pods, load

TOPOLOGY_OPTIONS = {"--nnodes", "--node-rank", "--node_rank", "--master-addr", "--master_addr", "--master-port",
                    "--master_port", "--nproc-per-node", "--nproc_per_node", "--standalone"}
"""multiproc.py's options that the platform's variables give: a launch file that sets them runs every node alike."""

PLATFORM_VARIABLES = re.compile(r"^(PET_|SKYPILOT_)|^(MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK)$")
"""Variables the platforms set for each node; set by hand they would be the same on every node, or refused."""


def stop_timeout(argv: list) -> float:
    """multiproc.py's ``--stop-timeout`` in ``argv`` (its options come before the training script)."""
    own = argv[:argv.index("train.py")]
    for i, arg in enumerate(own):
        if arg == "--stop-timeout":
            return float(own[i + 1])
        if arg.startswith("--stop-timeout="):
            return float(arg.split("=", 1)[1])
    pytest.fail(f"no --stop-timeout before train.py in {argv}: the default may not fit the grace period")


def option(argv: list, name: str) -> str:
    """The value of ``name`` (``--output-dir``) after ``train.py`` in ``argv``."""
    script = argv[argv.index("train.py") + 1:]
    for i, arg in enumerate(script):
        if arg == name:
            return script[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    pytest.fail(f"no {name} for train.py in {argv}")


def mounted_volume(pod: dict, container: dict, path: str):
    """``(volume mount, volume)`` of ``container`` whose mount holds ``path`` (the deepest), or ``(None, None)``."""
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    holding = [mount for mount in container.get("volumeMounts", [])
               if PurePosixPath(path).is_relative_to(mount["mountPath"])]
    if not holding:
        return None, None
    mount = max(holding, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    return mount, volumes.get(mount["name"])


def env_names(node) -> list:
    """Names of every environment variable a document sets: ``env`` lists of Kubernetes containers (and of a
    TrainJob's ``trainer``), anywhere in it, and a SkyPilot task's ``envs``."""
    found = []
    if isinstance(node, dict):
        for key, item in node.items():
            if key == "env" and isinstance(item, list):
                found += [entry.get("name") for entry in item if isinstance(entry, dict)]
            elif key == "envs" and isinstance(item, dict):
                found += list(item)
            found += env_names(item)
    elif isinstance(node, list):
        for item in node:
            found += env_names(item)
    return found



@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.relative_to(PROJECT).as_posix())
def test_launch_file_runs_multiproc_and_train_py_of_this_project_without_topology_options(path):
    argv = launch_command(path)
    assert argv[:2] == ["python", "multiproc.py"], argv
    assert "train.py" in argv, argv
    after = argv[argv.index("train.py") + 1:]
    assert after[:2] == ["--config", "config.json"], argv
    for name in ("multiproc.py", "train.py", "config.json"):
        assert (PROJECT / name).is_file(), f"{name} is not in the project root"
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    assert not given & TOPOLOGY_OPTIONS, f"the platform gives these, not the file: {sorted(given & TOPOLOGY_OPTIONS)}"
    assert stop_timeout(argv) > 0
    assert PurePosixPath(option(argv, "--output-dir")).is_absolute()


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.relative_to(PROJECT).as_posix())
def test_launch_file_sets_no_variable_the_platform_gives_each_node(path):
    names = env_names(load(path))
    assert not [name for name in names if PLATFORM_VARIABLES.search(name or "")], names


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=["trainjob", "pytorchjob"])
def test_kubernetes_grace_period_exceeds_multiprocs_stop_timeout(path):
    timeout = stop_timeout(launch_command(path))
    pods = kubernetes_pods(path)
    assert pods, f"{path.name}: no pod spec"
    for where, pod, _ in pods:
        grace = pod.get("terminationGracePeriodSeconds")
        assert grace is not None, f"{where}: Kubernetes' default 30 s is shorter than --stop-timeout {timeout:g}"
        assert timeout < grace, f"{where}: terminationGracePeriodSeconds {grace} <= --stop-timeout {timeout:g}"


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=["trainjob", "pytorchjob"])
def test_kubernetes_output_dir_is_on_a_writable_claim_and_shm_in_memory(path):
    argv = launch_command(path)
    output_dir, dataset = option(argv, "--output-dir"), option(argv, "--dataset-path")
    for where, pod, container in kubernetes_pods(path):
        assert container is not None, where
        mount, volume = mounted_volume(pod, container, output_dir)
        assert volume is not None, f"{where}: --output-dir {output_dir} is on no mounted volume (lost with the pod)"
        assert "persistentVolumeClaim" in volume, f"{where}: {output_dir} is on {volume}, not a PersistentVolumeClaim"
        assert not mount.get("readOnly") and not volume["persistentVolumeClaim"].get("readOnly"), where
        assert mounted_volume(pod, container, dataset)[1] is not None, f"{where}: --dataset-path {dataset} unmounted"
        mount, volume = mounted_volume(pod, container, "/dev/shm")
        assert mount is not None and mount["mountPath"] == "/dev/shm", f"{where}: /dev/shm keeps the node's 64 MB"
        assert volume.get("emptyDir", {}).get("medium") == "Memory", f"{where}: /dev/shm is {volume}"


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=["trainjob", "pytorchjob"])
def test_kubernetes_file_runs_this_projects_image_with_a_gpu_per_process(path):
    doc = load(path)
    if doc["kind"] == "TrainJob":
        trainer = doc["spec"]["trainer"]
        images = [trainer["image"]]
        gpus = [(trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"], trainer["numProcPerNode"])]
    else:
        containers = [container for _, _, container in kubernetes_pods(path)]
        images = [container["image"] for container in containers]
        gpus = [(container["resources"]["limits"]["nvidia.com/gpu"], doc["spec"]["nprocPerNode"])
                for container in containers]
    for image in images:
        name = image.rsplit("/", 1)[-1]  # a registry in front is the user's choice
        assert name == f"{SLUG}:latest", f"image {image!r} is not the project's ({SLUG}:latest)"
    for limit, processes in gpus:
        assert int(limit) == int(processes), f"{limit} GPUs for {processes} processes per node"
    dockerfile = (PROJECT / "Dockerfile").read_text()
    assert f"WORKDIR /workspace/{SLUG}\n" in dockerfile, "the command's relative paths need the project as WORKDIR"


def test_skypilot_output_dir_is_in_a_bucket_mounted_on_every_node():
    doc = load(SKYPILOT)
    argv = launch_command(SKYPILOT)
    output_dir, dataset = option(argv, "--output-dir"), option(argv, "--dataset-path")
    mounts = doc.get("file_mounts", {})
    holding = [target for target in mounts if PurePosixPath(output_dir).is_relative_to(target)]
    assert holding, f"--output-dir {output_dir} is on no file_mount: it would be lost with the cluster"
    bucket = mounts[max(holding, key=len)]
    assert isinstance(bucket, dict) and bucket.get("mode", "MOUNT") == "MOUNT", (
        f"{bucket}: MOUNT writes a checkpoint to the bucket when it is closed (COPY never writes back, "
        "MOUNT_CACHED uploads later)")
    assert any(PurePosixPath(dataset).is_relative_to(target) for target in mounts), f"{dataset} is not mounted"


TRACKER_SECRET = "tracker-credentials"
"""The Kubernetes Secret the manifests read the experiment trackers' credentials from (``utils/tracking``)."""
STORE_SECRET = "object-store-credentials"
"""The Secret of the S3 endpoint and credentials of shards on ``s3://`` (the corpora part)."""
STORE_NAMES = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"}


def secret_refs(container: dict, secret: str) -> list:
    """The ``envFrom`` entries of a container that name the Secret ``secret``."""
    return [ref for ref in container.get("envFrom") or [] if ref["secretRef"]["name"] == secret]


def test_tracker_credentials_reach_every_node_from_an_optional_secret_and_none_is_written():
    """With the experiment trackers: the TrainJob's trainer and every PyTorchJob container take their credentials
    from the Secret, optional (a job starts without it); SkyPilot's are empty until given at launch (``--secret``,
    ``--env``). Without the trackers, no launch file names them."""
    trainer_env = [item for item in load(TRAINJOB)["spec"]["trainer"].get("env", [])
                   if item["valueFrom"]["secretKeyRef"]["name"] == TRACKER_SECRET]
    env_from = [secret_refs(container, TRACKER_SECRET) for _, _, container in kubernetes_pods(PYTORCHJOB)]
    sky = load(SKYPILOT)
    sky["secrets"] = {name: value for name, value in sky.get("secrets", {}).items() if not name.startswith("AWS_")}
    if not (PROJECT / "utils" / "tracking").is_dir():
        assert (trainer_env, env_from, sky["secrets"], sky.get("envs")) == ([], [[], []], {}, None)
        return
    refs = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in trainer_env}
    assert set(refs) == {"WANDB_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN"}
    assert all(ref == {"name": TRACKER_SECRET, "key": name, "optional": True} for name, ref in refs.items())
    assert env_from == [[{"secretRef": {"name": TRACKER_SECRET, "optional": True}}]] * 2  # Master and Worker
    assert sky["secrets"] == {"WANDB_API_KEY": ""} and sky["envs"] == {"MLFLOW_TRACKING_URI": ""}


def test_object_store_credentials_reach_every_node_from_an_optional_secret_and_none_is_written():
    """With the corpora part (shards on ``s3://``): the TrainJob's trainer takes the S3 endpoint, region and
    credentials from the Secret, each optional, and every PyTorchJob container all its keys (optional: a job starts
    without it); SkyPilot's credentials are empty until given at launch (``--secret``). Without the part, no launch
    file names them."""
    trainer = {item["name"]: item["valueFrom"]["secretKeyRef"]
               for item in load(TRAINJOB)["spec"]["trainer"].get("env", []) if item["name"].startswith("AWS_")}
    env_from = [secret_refs(container, STORE_SECRET) for _, _, container in kubernetes_pods(PYTORCHJOB)]
    sky = {name: value for name, value in (load(SKYPILOT).get("secrets") or {}).items() if name.startswith("AWS_")}
    if not (PROJECT / "utils" / "data" / "shar_store.py").is_file():
        assert (trainer, env_from, sky) == ({}, [[], []], {})
        assert not any("AWS_" in path.read_text() for path in LAUNCH_FILES)
        return
    assert trainer == {name: {"name": STORE_SECRET, "key": name, "optional": True} for name in STORE_NAMES}
    assert env_from == [[{"secretRef": {"name": STORE_SECRET, "optional": True}}]] * 2  # Master and Worker
    assert sky == {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
