"""Matcha-TTS against shivammehta25/Matcha-TTS: its Cython alignment search on random scores, and its LJSpeech (1
speaker) and VCTK (109 speakers) models, given the reference's weights (``conftest.formula_state``, in its key names,
read by ``from_reference``) and inputs, compute the reference's encoder outputs, durations, each Euler step, mel and
training losses (``tests/data/reference``, made by ``make_fixtures_matcha.py``)."""

import functools

import numpy as np
import pytest
import torch
from conftest import assert_close, formula_state, reference_fixture

from models.matcha.monotonic_align import maximum_path
from models.matcha.network import MatchaTTS, from_reference
from modules.matcha import generate_path

CONFIGS = ["ljspeech", "vctk"]


@functools.cache
def reference_network(name: str) -> tuple[MatchaTTS, dict, dict]:
    """``(model, arrays, meta)``: the fixture's model, holding the reference's formula weights (and its
    ``overrides``: constants that make the durations differ) in eval mode (made once: the tests only read it)."""
    arrays, meta = reference_fixture(f"net_matcha_{name}.npz")
    model = MatchaTTS(n_spks=meta["data"]["n_spks"])
    state = formula_state(meta)
    state.update({key: torch.full_like(state[key], value) for key, value in meta["overrides"].items()})
    model.load_state_dict(from_reference(state))
    return model.eval(), arrays, meta


def test_the_alignment_search_finds_the_references_paths():
    arrays, meta = reference_fixture("mas_matcha.npz")
    for k, case in enumerate(meta["cases"]):
        path = maximum_path(torch.from_numpy(arrays[f"value_{k}"]), torch.from_numpy(arrays[f"mask_{k}"]))
        assert path.dtype == torch.float32 and np.array_equal(path.numpy(), arrays[f"path_{k}"]), case
    path = generate_path(torch.from_numpy(arrays["durations"]), torch.from_numpy(arrays["durations_mask"]))
    assert np.array_equal(path.numpy(), arrays["durations_path"])


@pytest.mark.parametrize("name", CONFIGS)
def test_every_reference_key_has_one_of_ours_of_its_shape(name):
    """The reference's state_dict names map one to one onto this network's, every one of both used, shapes equal;
    the parameter count is the reference's (LJSpeech: about 18 M)."""
    model, _, meta = reference_network(name)
    ours = model.state_dict()
    mapped = from_reference(formula_state(meta))
    assert sorted(mapped) == sorted(ours) and len(mapped) == len(meta["keys"])
    assert all(mapped[key].shape == ours[key].shape for key in ours)
    count = sum(int(np.prod(shape)) for _, shape, _ in meta["keys"])
    assert sum(p.numel() for p in model.parameters()) == count
    if name == "ljspeech":
        assert 18.0e6 < count < 18.5e6, count


@pytest.mark.parametrize("name", CONFIGS)
def test_synthesis_computes_the_references_steps_and_mel(name):
    model, arrays, meta = reference_network(name)
    ids, lengths = torch.from_numpy(arrays["text_ids"]), torch.from_numpy(arrays["text_lengths"])
    speakers = torch.from_numpy(arrays["speakers"]) if "speakers" in arrays else None
    with torch.no_grad():
        mu_x, logw, _, _ = model.encode(ids, lengths, speakers)
        steps = []
        out = model.synthesise(ids, lengths, n_timesteps=3, temperature=0.667, speakers=speakers,
                               noise=torch.from_numpy(arrays["noise"]), steps=steps)
    assert_close(mu_x, arrays["mu_x"], "encoder mu")
    assert_close(logw, arrays["logw"], "log-durations")
    assert np.array_equal(out["durations"].numpy(), arrays["w_ceil"])
    assert np.array_equal(out["mel_lengths"].numpy(), arrays["y_lengths"])
    assert np.array_equal(out["attn"].numpy(), arrays["attn"])
    assert_close(out["mu_y"], arrays["mu_y"], "aligned mu")
    for k, step in enumerate([*steps, out["decoder_out"]]):
        assert_close(step, arrays["euler_x"][k], f"Euler step {k}")
    frames = int(out["mel_lengths"].max())
    mel = out["decoder_out"][:, :, :frames] * meta["data"]["mel_std"] + meta["data"]["mel_mean"]
    assert_close(mel, arrays["mel"], "mel")


@pytest.mark.parametrize("name", CONFIGS)
def test_a_training_step_computes_the_references_losses(name):
    """The same ``t`` and noise: the alignment search's path, the duration, prior and flow-matching losses."""
    model, arrays, _ = reference_network(name)
    speakers = torch.from_numpy(arrays["speakers"]) if "speakers" in arrays else None
    with torch.no_grad():
        duration, prior, flow, attn = model.losses(
            torch.from_numpy(arrays["text_ids"]), torch.from_numpy(arrays["text_lengths"]),
            torch.from_numpy(arrays["y"]), torch.from_numpy(arrays["y_lengths_train"]), speakers,
            t=torch.from_numpy(arrays["t"]), noise=torch.from_numpy(arrays["z"]))
    assert np.array_equal(attn.numpy(), arrays["attn_train"])
    assert_close(duration, arrays["dur_loss"], "duration loss")
    assert_close(prior, arrays["prior_loss"], "prior loss")
    assert_close(flow, arrays["diff_loss"], "flow-matching loss")
