"""The ``padding`` finding followed (docs/tokens.md): a small transformer trained on texts of
mixed lengths, batches padded to their longest text, shuffled; then the same texts grouped by
length (transformers' ``LengthGroupedSampler``), as the finding's fix says.

A real ``transformers`` fast tokenizer built here (no hub), 1,024 texts of 8 to 256 words
(log-normal, median 45: many short, a few long), batches of 16 through
``DataCollatorWithPadding``; a 2-layer ``nn.TransformerEncoder`` (d_model 64) in training mode,
so it computes on the pads and masks them. First pipeprof's view of one epoch of each (the
finding, its padding share and the compute a step the pads stand for), then plain epochs (no
pipeprof), interleaved rounds, the median samples/s of each.

    .venv/bin/python benchmarks/padding_waste.py --rounds 3   # ~2 min
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from _common import emit, machine
from tokenize_batched import WORDS, tokenizer


class Texts:
    """Texts of the given word counts, tokenized in ``__getitem__``."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.tok = tokenizer()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Any:
        words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(self.lengths[i]))
        return {**self.tok(words), "labels": i % 2}


def lengths(n: int) -> list[int]:
    rng = random.Random(0)
    return [min(256, max(8, int(rng.lognormvariate(3.8, 0.6)))) for _ in range(n)]


def model() -> Any:
    import torch
    from torch import nn

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(len(WORDS) + 2, 64)
            layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(64, 2)

        def forward(self, ids: Any, mask: Any) -> Any:
            h = self.encoder(self.embed(ids), src_key_padding_mask=mask == 0)
            keep = mask.unsqueeze(-1).to(h.dtype)
            return self.head((h * keep).sum(1) / keep.sum(1))

    torch.manual_seed(0)
    return Classifier()


def loader(data: Texts, grouped: bool) -> Any:
    import torch
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding
    from transformers.trainer_pt_utils import LengthGroupedSampler

    collate = DataCollatorWithPadding(data.tok)
    g = torch.Generator().manual_seed(1)
    if grouped:
        sampler = LengthGroupedSampler(16, lengths=data.lengths, generator=g)
        return DataLoader(data, batch_size=16, sampler=sampler, collate_fn=collate)
    return DataLoader(data, batch_size=16, shuffle=True, generator=g, collate_fn=collate)


def epoch(batches: Any, net: Any, opt: Any) -> int:
    import torch

    n = 0
    for b in batches:
        loss = torch.nn.functional.cross_entropy(net(b["input_ids"], b["attention_mask"]),
                                                 b["labels"])  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += len(b["labels"])
    return n


def profiled(data: Texts, grouped: bool) -> dict[str, Any]:
    import torch

    import pipeprof

    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        epoch(prof.wrap(loader(data, grouped)), net, opt)
    report = prof.report().to_dict()
    found = {f["id"]: f for f in report["findings"]}
    return {
        "padding_share": report["tokens"]["padding_share"],
        "compute_ms_per_step": report["loop"]["compute_ms"]["mean_ms"],
        "verdict": report["verdict"]["headline"],
        "finding": found.get("padding"),
    }


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--texts", type=int, default=1024)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    data = Texts(lengths(args.texts))
    out: dict[str, Any] = {"machine": machine(), "texts": args.texts,
                           "torch_threads": torch.get_num_threads()}  # fmt: skip
    out["profiled"] = {k: profiled(data, k == "grouped") for k in ("shuffled", "grouped")}
    rates: dict[str, list[float]] = {"shuffled": [], "grouped": []}
    for r in range(args.rounds):
        for k in ("shuffled", "grouped") if r % 2 == 0 else ("grouped", "shuffled"):
            net = model()
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
            t = time.perf_counter()
            n = epoch(loader(data, k == "grouped"), net, opt)
            rates[k].append(n / (time.perf_counter() - t))
    out["samples_per_s"] = {k: statistics.median(v) for k, v in rates.items()}
    out["rates"] = rates
    out["speedup"] = out["samples_per_s"]["grouped"] / out["samples_per_s"]["shuffled"]
    before, after = out["profiled"]["shuffled"], out["profiled"]["grouped"]
    promised = (before["finding"] or {}).get("evidence", {}).get("pad_compute_ms_per_step")
    out["compute_saved_ms_per_step"] = before["compute_ms_per_step"] - after["compute_ms_per_step"]
    out["promised_ms_per_step"] = promised
    emit(out, args.json)


if __name__ == "__main__":
    main()
