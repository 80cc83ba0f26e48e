"""The incident reproduced and fixed in plain torch, on CUDA graphs (see incident_scenario.py).

The index-K store is the incident's one line, ``pool.view(-1, 128)[loc] = k.to(torch.bfloat16)``,
captured with ``torch.cuda.graph`` at batch 8 and replayed with 3 real rows whose padded ``loc``
rows keep the previous replay's slots, while a ``dsa.SlotAuditor`` watches the pool: it records each
store's real rows with the keys they were given (their digests are computed on the device) and
verifies with a kernel on the pool (nothing is copied to the host). The same loop with that line replaced by
``dsa.store_index_k(pool, loc, k, n_real)`` reports no clobbered slot.

    python3 python/examples/incident_torch.py [--rounds 10] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import incident_scenario as scenario  # noqa: E402


class TorchArrays(scenario.Arrays):
    def __init__(self, device: str = "cuda"):
        self.device = torch.device(device)
        self.name = f"torch {torch.__version__} on {torch.cuda.get_device_name(self.device)}"

    def pool(self, pages):
        return torch.zeros((pages, scenario.PAGE, 128), dtype=torch.bfloat16, device=self.device)

    def static_int64(self, n):
        return torch.full((n,), -1, dtype=torch.int64, device=self.device)

    def static_f32(self, rows, cols):
        return torch.zeros((rows, cols), dtype=torch.float32, device=self.device)

    def int32_scalar(self):
        return torch.zeros(1, dtype=torch.int32, device=self.device)

    def set_rows(self, buf, values, rows):
        buf[:rows].copy_(torch.tensor(values, dtype=buf.dtype))

    def set_scalar(self, buf, value):
        buf.fill_(value)

    def unguarded_store(self, pool, loc, k):
        pool.view(-1, 128)[loc] = k.to(torch.bfloat16)  # the incident's line

    def to_int(self, scalar):
        return int(scalar.item())

    def capture(self, step):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # warm-up, as torch asks before a capture (same rows: idempotent)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph.replay


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("incident_torch: no CUDA device; the CPU variant is incident_numpy.py", file=sys.stderr)
        return 2
    xp = TorchArrays()
    rows = scenario.table(xp, args.rounds, args.seed)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scenario.print_table(rows, f"index-K bf16 store, {xp.name}, torch.cuda.graph at batch 8")
    print(out.getvalue())
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(out.getvalue())
    unguarded_graph = rows[0]
    others = rows[1:]
    ok = unguarded_graph["corrupted"] > 0 and all(r["corrupted"] == 0 for r in others)
    print("fingerprint:", "REPRODUCED (unguarded + graph corrupts; the rest do not)" if ok
          else "NOT reproduced")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
