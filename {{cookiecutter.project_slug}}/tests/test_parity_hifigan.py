"""HiFi-GAN against jik876/hifi-gan: its V1, V2 and V3 generators, given the reference's weights
(``conftest.formula_state``, in its key names, read by ``Published.read``) and input, compute the reference's audio
(``tests/data/reference``, whose README says how it was made); each variant's file imports as that variant."""

import json

import pytest
import torch
from conftest import (ROOT, assert_close, formula_state, import_published, mel_input, reference_config,
                      reference_fixture, reference_model, run_train_main, synth_corpus, train_in_process,
                      train_on_ranks)

from models import MODELS
from models.hifigan.published import PUBLISHED
from parts import PARTS, config_schemas
from scripts import import_weights
from utils.checkpoint.files import CheckpointError
from utils.config import load_config

pytestmark = [pytest.mark.skipif("hifigan" not in MODELS, reason="no HiFi-GAN in this project"),
              pytest.mark.filterwarnings("error::DeprecationWarning", "error::FutureWarning")]


def generator_settings(meta) -> dict:
    """The reference's generator config (``resblock`` is a string there) as this project's ``hifigan`` settings."""
    return {"hifigan": {**meta["config"], "resblock": int(meta["config"]["resblock"])}}


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_the_generator_computes_jik876s_audio(version):
    arrays, meta = reference_fixture(f"net_hifigan_{version}.npz")
    cfg = reference_config(**generator_settings(meta))
    model = reference_model("hifigan", cfg, PUBLISHED.read({"generator": formula_state(meta)}, cfg))
    with torch.no_grad():
        audio = model.generator(mel_input(6))
    assert_close(audio, arrays["audio"], f"HiFi-GAN {version} audio")


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_each_variant_is_told_apart_by_its_weights_shapes(version):
    """Read with the default config (V1's) or the tiny one: the variant is named, and its settings replace the
    config's generator settings where they differ."""
    _, meta = reference_fixture(f"net_hifigan_{version}.npz")
    zeros = {key: torch.zeros(shape) for key, shape, _ in meta["keys"]}
    for tiny in (False, True):
        cfg = load_config(f"{ROOT}/config.json", config_schemas(), tiny=tiny)
        weights = PUBLISHED.read({"generator": zeros}, cfg)
        assert weights.source.startswith(f"jik876/hifi-gan's {version.upper()} generator file"), weights.source
        assert ("replace the config's" in weights.source) == (tiny or version != "v1"), weights.source
        got = {key: getattr(cfg.hifigan, key) for key in meta["config"]}
        assert json.loads(json.dumps(got)) == generator_settings(meta)["hifigan"]


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_a_generator_file_imports_as_its_variant_with_no_settings_given(tmp_path, version):
    """``import_weights`` with the default config (V1's) and no ``--set`` says which variant it read, writes its
    generator settings and jik876's mel framing, and the checkpoint computes the reference's audio. V3's residual
    blocks (type 2) are ``resblocks.<n>.convs.<m>`` in jik876's files."""
    arrays, meta = reference_fixture(f"net_hifigan_{version}.npz")
    theirs = formula_state(meta)
    torch.save({"generator": theirs}, tmp_path / f"g_{version}")
    saved, line = import_published(tmp_path, tmp_path / f"g_{version}", {})
    assert f"from jik876/hifi-gan's {version.upper()} generator file" in line, line
    assert ("replace the config's" in line) == (version != "v1"), line
    assert saved["config"]["audio"]["mel_framing"] == "jik876"  # HiFi-GAN's recipe: jik876's frames
    settings = {key: saved["config"]["hifigan"][key] for key in meta["config"]}
    assert json.loads(json.dumps(settings)) == generator_settings(meta)["hifigan"]
    model = MODELS["hifigan"].build_model(reference_config(hifigan=settings)).eval()
    model.load_state_dict(saved["model"])
    with torch.no_grad():
        assert_close(model.generator(mel_input(6)), arrays["audio"], f"imported HiFi-GAN {version} audio")
    if version == "v3":
        assert torch.equal(saved["model"]["generator.mrfs.1.blocks.2.dilated.1.parametrizations.weight.original1"],
                           theirs["resblocks.5.convs.1.weight_v"])  # resblocks.<3 i + j> -> mrfs.<i>.blocks.<j>


def test_a_generator_file_of_no_published_shapes_is_refused_naming_the_closest(tmp_path, capsys):
    """V2's weights with a last upsampling kernel of 8 (V2's is 4): one line naming V2 and what differs."""
    _, meta = reference_fixture("net_hifigan_v2.npz")
    theirs = formula_state(meta)
    theirs["ups.3.weight_v"] = torch.zeros(16, 8, 8)
    torch.save({"generator": theirs}, tmp_path / "g_other")
    assert import_weights.main([str(tmp_path / "g_other"), "--output", str(tmp_path / "out.pt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR: "), err
    assert ("fits neither this config's generator nor V1, V2 or V3; the closest, V2, differs in upsample_kernel_sizes "
            "(the file: (16, 16, 4, 8), V2: (16, 16, 4, 4))") in err[0], err
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("change, file_kernels", [("ups.3 kernel 8", "(16, 16, 4, 8)"),
                                                  ("no ups.3", "(16, 16, 4)")])
def test_a_near_v1_generator_file_is_refused_naming_v1_and_only_what_differs(change, file_kernels):
    """V1's weights with its last upsampling kernel 8, or without its last upsampling layer (``ups.3``; its residual
    blocks kept): with the default config (V1's) or the tiny one, the closest named is V1, never the config, and the one
    entry that differs is the upsampling kernels (12 residual blocks over 3 upsampling layers are not 4 kernels)."""
    _, meta = reference_fixture("net_hifigan_v1.npz")
    theirs = {key: torch.zeros(shape) for key, shape, _ in meta["keys"]}
    if change == "no ups.3":
        theirs = {key: value for key, value in theirs.items() if not key.startswith("ups.3.")}
    else:
        theirs["ups.3.weight_v"] = torch.zeros(64, 32, 8)
    for tiny in (False, True):
        cfg = load_config(f"{ROOT}/config.json", config_schemas(), tiny=tiny)
        with pytest.raises(CheckpointError) as refused:
            PUBLISHED.read({"generator": theirs}, cfg)
        assert str(refused.value).endswith(
            f"the closest, V1, differs in upsample_kernel_sizes (the file: {file_kernels}, V1: (16, 16, 4, 4)). Give "
            "the generator's settings with --set hifigan.KEY=VALUE"), str(refused.value)


@pytest.mark.slow
def test_a_v3_generator_file_fine_tunes_with_no_settings_given(tmp_path):
    """``train.py --init-from`` a V3 generator file and the tiny config, no ``--set hifigan.*`` (80 mel channels, as the
    file's): the file is read before the model is built, so the generator takes V3's shapes, and the run trains."""
    _, meta = reference_fixture("net_hifigan_v3.npz")
    torch.save({"generator": formula_state(meta)}, tmp_path / "g_v3")
    corpus, out = synth_corpus(tmp_path / "corpus", n=6), tmp_path / "out"
    said = train_in_process(["--config", "config.json", "--model", "hifigan", "--tiny", "--max-steps", "1",
                             "--init-from", str(tmp_path / "g_v3"), "--dataset-path", str(corpus), "--output-dir",
                             str(out), "--set", "data.num_workers=0", "--set", "train.val_interval=1000",
                             "--set", "audio.n_mels=80"])
    assert "jik876/hifi-gan's V3 generator file; V3's generator settings" in said, said[-3000:]
    saved = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert saved["config"]["hifigan"]["resblock"] == 2 and saved["step"] == 1


@pytest.mark.slow
def test_a_v2_fine_tuning_job_restarts_with_the_command_that_started_it(tmp_path):
    """``train.py --init-from`` a V2 generator file, no ``--set hifigan.*``: the settings the file set travel in the
    run's checkpoints (``weights_settings``). Stopped after a checkpoint, the job restarts with the same command (the
    run's own checkpoint wins over ``--init-from``), then with ``--resume auto`` and no ``--init-from``, then from
    ``--resume PATH`` in another folder, each on V2's generator, one line naming the settings kept over the config's;
    such settings that fail the config's checks are one line, nothing trained. One process: every rank reads the
    checkpoint and sets them alike."""
    _, meta = reference_fixture("net_hifigan_v2.npz")
    torch.save({"generator": formula_state(meta)}, tmp_path / "g_v2")
    corpus, out = synth_corpus(tmp_path / "corpus", n=6), tmp_path / "out"
    common = ["--config", "config.json", "--model", "hifigan", "--tiny", "--dataset-path", str(corpus),
              *(f"--set={setting}" for setting in ("data.num_workers=0", "train.val_interval=1000", "audio.n_mels=80",
                                                   "train.checkpoint_interval=1", "hifigan.segment_length=1024",
                                                   "hifigan.batch_size=1"))]
    command = [*common, "--output-dir", str(out), "--max-steps", "2", "--init-from", str(tmp_path / "g_v2")]
    assert "V2's generator settings (config_v2.json) replace the config's" in train_in_process(command)
    for late in ("checkpoint_2.pt", "checkpoint_last.pt"):  # preempted after its step 1 checkpoint
        (out / late).unlink()
    kept = "kept over the config's: hifigan.upsample_initial_channel=128 (config: 32), hifigan.resblock_kernel_sizes"
    other = tmp_path / "other"
    runs = {"the same command": (command, out / "checkpoint_1.pt", out / "checkpoint_2.pt"),  # (argv, from, to)
            "--resume auto": ([*common, "--output-dir", str(out), "--max-steps", "3", "--resume", "auto"],
                              out / "checkpoint_last.pt", out / "checkpoint_3.pt"),
            "--resume PATH": ([*common, "--output-dir", str(other), "--max-steps", "4", "--resume",
                               str(out / "checkpoint_3.pt")], out / "checkpoint_3.pt", other / "checkpoint_4.pt")}
    for how, (argv, resumed, written) in runs.items():  # --resume PATH on 2 gloo ranks: each sets the settings
        said = train_on_ranks(argv, tmp_path / "ranks")[0] if how == "--resume PATH" else train_in_process(argv)
        assert f"resumed from {resumed} at step {int(written.stem[11:]) - 1} " in said, (how, said[-3000:])
        assert f"note: {resumed} was trained with settings its first weights (--init-from) set, {kept}" in said, how
        assert "warning: the config differs" not in said, (how, said[-3000:])
        saved = torch.load(written, weights_only=True)
        assert saved["config"]["hifigan"]["upsample_initial_channel"] == 128, how
        assert saved["model"]["generator.conv_pre.bias"].shape == (128,), how
        assert saved["weights_settings"]["hifigan"]["upsample_initial_channel"] == 128, how
    saved["weights_settings"]["hifigan"]["upsample_initial_channel"] = 0
    torch.save(saved, tmp_path / "bad.pt")
    code, _, errors = run_train_main([*common, "--output-dir", str(tmp_path / "bad"), "--max-steps", "5", "--resume",
                                      str(tmp_path / "bad.pt")])
    lines = [line for line in errors.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and "Traceback" not in errors and lines == [
        f"ERROR: rank 0: {tmp_path / 'bad.pt'}: its weights_settings: config key 'hifigan.upsample_initial_channel' "
        "must be >= 1, got 0"], errors[-3000:]
    assert not list((tmp_path / "bad").glob("checkpoint_*"))


# --- jik876/hifi-gan's generator files (utils.checkpoint.published, read_published) --------------------------------

def jik876_generator_file(path):
    """A generator file as jik876/hifi-gan's training writes it (``{"generator": state_dict}``: old weight norm,
    ``resblocks.<i * kernels + j>.convs1/convs2``), of a tiny model of this project; ``(model, cfg)``."""
    import re

    from conftest import old_weight_norm_names, perturbed_tiny_model

    model, cfg = perturbed_tiny_model("hifigan")
    kernels = len(cfg.hifigan.resblock_kernel_sizes)
    theirs = {}
    for key, value in model.state_dict().items():
        if key.startswith("generator."):
            key = old_weight_norm_names(key[len("generator."):])
            match = re.match(r"^mrfs\.(\d+)\.blocks\.(\d+)\.(dilated|plain)\.(.*)$", key)
            if match:
                key = (f"resblocks.{int(match.group(1)) * kernels + int(match.group(2))}."
                       f"convs{1 if match.group(3) == 'dilated' else 2}.{match.group(4)}")
            theirs[key] = value
    assert "conv_pre.weight_g" in theirs and "resblocks.0.convs1.0.weight_v" in theirs
    torch.save({"generator": theirs}, path)
    return model, cfg


def test_jik876s_generator_file_loads_exactly_and_the_discriminators_start_afresh(tmp_path):
    from conftest import perturbed_tiny_model

    from utils.checkpoint.weights import load_into, read_weights

    model, cfg = jik876_generator_file(tmp_path / "g_02500000")
    weights = read_weights(tmp_path / "g_02500000", MODELS, cfg, formats=PARTS.formats)
    assert weights.source == "jik876/hifi-gan's generator file"
    fresh, _ = perturbed_tiny_model("hifigan")
    with torch.no_grad():
        fresh.generator.conv_pre.bias.add_(1.0)  # differs from the file's before the load
    discriminator = {k: v.clone() for k, v in fresh.state_dict().items() if k.startswith("discriminator.")}
    assert load_into(fresh, weights, "g") == ["discriminator."]
    for key, value in fresh.state_dict().items():
        expected = model.state_dict()[key] if key.startswith("generator.") else discriminator[key]
        assert torch.equal(value, expected), key


@pytest.mark.slow
def test_a_run_starts_from_jik876s_generator(tmp_path):
    from conftest import train_from_and_infer

    jik876_generator_file(tmp_path / "g_02500000")
    train_from_and_infer(tmp_path, "hifigan", tmp_path / "g_02500000", [])
