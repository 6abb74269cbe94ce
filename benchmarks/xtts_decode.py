"""XTTS-v2's decoding on this machine, with no files and no peer: the GPT's code steps eager
against replayed as a CUDA graph, float32 against bfloat16, and the HiFi-GAN decoder.

    python benchmarks/xtts_decode.py [--size released|reduced] [--device auto|cpu|cuda]
        [--codes N] [--threads T]

The networks are built at ``--size`` with seeded random weights (no download, no
tokenizer: the text is random token ids), so this runs wherever torch does, the offline
GPU machine included (``gpu_acceptance.py``'s xtts part). Greedy decoding of ``--codes``
codes after a prefill of 32 voice latents and 60 text tokens; the stop logit is lowered so
every run decodes exactly ``--codes`` codes. Rows: ms per code (the prefill left out; on a
GPU the graph's capture, once per decode, included) and the codes' equality
(graphed against eager); the blocks' projections alone on one row, the weights read once,
which bounds a step where memory bandwidth does (a CPU's), with the step's time over
theirs when the two are timed alternately, code by code (``check``: the figure least moved
by a shared machine); then the HiFi-GAN's seconds per second of 24 kHz audio. The graph
row exists on CUDA only (on a CPU the step always runs eagerly). Ratios are against eager
float32, measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import common

SIZES = {"released": (30, 1024, 16), "reduced": (2, 256, 4)}
TEXT_TOKENS = 60


def timed(device, fn):
    """``(seconds, fn())``, the device's queue drained before and after."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, out


def projections_against_step(gpt, voice, tokens, device, codes: int = 30) -> tuple[float, float]:
    """The GPT blocks' projections alone (``c_attn``, ``c_proj``, ``c_fc``, the MLP's
    ``c_proj``, on one row, as a step runs them) and decode steps, timed alternately, code
    by code, so that both see the same machine: the projections' median ms and the median
    of the step's time over theirs. Where reading the weights bounds a step (a CPU's
    decode), the projections are its floor."""
    import statistics

    import torch

    linears = [m for block in gpt.gpt.h for m in (block.attn.c_attn, block.attn.c_proj,
                                                   block.mlp.c_fc, block.mlp.c_proj)]
    inputs = {n: torch.randn(1, 1, n, device=device) for n in {m.weight.shape[0] for m in linears}}
    steps, floors = [], []
    with torch.inference_mode():
        cache = gpt.gpt.new_cache(1, gpt.prefix_length(tokens.shape[1]) + codes + 1)
        logits, _ = gpt.prefill(voice, tokens, cache)
        code = logits.argmax(-1)
        for i in range(codes + 1):
            took, (logits, _) = timed(device, lambda c=code: gpt.step(c, cache))
            code = logits.argmax(-1)
            floor, _ = timed(device, lambda: [m(inputs[m.weight.shape[0]]) for m in linears])
            if i:  # the first of each warms up
                steps.append(took)
                floors.append(floor)
    return (statistics.median(floors) * 1000,
            statistics.median(a / b for a, b in zip(steps, floors)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=tuple(SIZES), default="released")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--codes", type=int, default=200, help="codes decoded per run (~46 ms each)")
    p.add_argument("--threads", type=int, default=0, help="torch threads on a CPU (0: torch's)")
    args = p.parse_args()
    if args.codes < 2:
        p.error("--codes: give 2 or more (a step's time is the decode's less its first code's)")

    import torch

    from myxtts.config import resolve_device
    from myxtts.inference.xtts_v2 import decode
    from myxtts.model.xtts_v2.config import XttsV2Args, XttsV2Config, XttsV2Sampling
    from myxtts.model.xtts_v2.model import XttsV2Model

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "--device")
    layers, dim, heads = SIZES[args.size]
    config = XttsV2Config(args=XttsV2Args(gpt_layers=layers, gpt_n_model_channels=dim,
                                          gpt_n_heads=heads, decoder_input_dim=dim))
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: no host copy of 464 M parameters
        model = XttsV2Model(config).eval()
    with torch.no_grad():
        model.gpt.mel_head.bias[model.gpt.stop_audio_token] -= 1e4  # never stops early
    g = torch.Generator().manual_seed(1)
    voice = torch.randn(1, 32, dim, generator=g).to(device)
    tokens = torch.randint(2, config.number_text_tokens - 2, (1, TEXT_TOKENS), generator=g).to(device)
    sampling = XttsV2Sampling()
    real_graph = decode.graphed_step

    def decode_run(graphed: bool) -> tuple[float, torch.Tensor]:
        """ms per code of a decode of ``--codes`` codes, its prefill left out: the time of
        the whole decode less that of a decode of one code (the prefill and one choice;
        the faster of two), over the codes after the first."""
        decode.graphed_step = real_graph if graphed else (lambda *a: None)

        def run(n: int):
            return decode.generate_codes(model.gpt, voice, tokens, sampling, greedy=True,
                                         max_codes=n)

        try:
            run(8)  # the warm-up
            prefill = min(timed(device, lambda: run(1))[0], timed(device, lambda: run(1))[0])
            took, codes = timed(device, lambda: run(args.codes))
            return (took - prefill) * 1000 / (args.codes - 1), codes
        finally:
            decode.graphed_step = real_graph

    rows = []
    arms = [("eager, float32", torch.float32, False)]
    if device.type == "cuda":
        arms.append(("CUDA graph, float32", torch.float32, True))
    arms.append(("eager, bfloat16", torch.bfloat16, False))
    if device.type == "cuda":
        arms.append(("CUDA graph, bfloat16", torch.bfloat16, True))
    base_ms, last = None, {}
    for label, dtype, graphed in arms:
        model.set_gpt_dtype(dtype)
        common.say(f"decoding {args.codes} codes: {label} ...")
        ms, codes = decode_run(graphed)
        base_ms = base_ms or ms
        same = ""
        if graphed:
            same = "codes = eager's" if torch.equal(codes, last[dtype]) else "CODES DIFFER"
        last.setdefault(dtype, codes)
        rows.append((f"GPT step, {label} (ms per code)", [f"{ms:.2f}", f"{base_ms / ms:.2f}x", same]))
        if len(rows) == 1:  # right after the eager float32 step, so that both see one machine
            floor, over = projections_against_step(model.gpt, voice, tokens, device)
            rows.append(("  its projections alone, one row (ms per code)",
                         [f"{floor:.2f}", f"{base_ms / floor:.2f}x", f"step {over:.2f}x"]))
    model.set_gpt_dtype(torch.float32)
    latents = torch.randn(1, args.codes, dim, generator=g).to(device)
    speaker = torch.nn.functional.normalize(torch.randn(1, 512, 1, generator=g), dim=1).to(device)
    with torch.inference_mode():
        model.waveform(latents[:, :8], speaker)
        took, wav = timed(device, lambda: model.waveform(latents, speaker))
    audio_s = wav.shape[-1] / model.sample_rate
    rows.append(("HiFi-GAN decoder (s per s of audio)", [f"{took / audio_s:.4f}", "", ""]))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    head = [f"XTTS-v2 {args.size} size, seeded random weights; {args.codes} codes after a "
            f"{32 + TEXT_TOKENS + 3}-position prefix; {name}, torch {torch.__version__}, "
            f"threads {torch.get_num_threads()}"]
    print(common.table(["measured", "vs eager fp32", "check"], rows, head, first="measure",
                       width=16))


if __name__ == "__main__":
    main()
