"""The incident as a toy decode loop, shared by incident_numpy.py (CPU) and incident_torch.py
(CUDA graphs).

An engine decodes a batch of sessions with one line storing index-K into a paged bf16 pool. Decode
runs through a runner that, in graph mode, records the step once at bucket size 8 over static
buffers and replays it; at every replay it copies the real rows in and leaves the padded rows as
the previous replay left them (the incident's stale padding). Each round:

1. 8 sessions are prefilled (eagerly, guarded) and decode 4 steps together at batch 8;
2. 5 of them finish: their pages go back to the allocator, which hands them (last freed, first
   reused) to 5 new sessions that are prefilled now and wait for their turn to decode;
3. the 3 remaining sessions decode 4 more steps: 3 real rows in the bucket of 8. The padded rows'
   slot map still holds the finished sessions' last slots, now inside the new sessions' pages.

With the unguarded scatter (``pool.view(-1, 128)[loc] = k``) the padded rows overwrite the new
sessions' index keys; ``dsa.store_index_k`` skips them (rule 1: row >= n_real); in eager mode the
step runs at the real batch size and there are no padded rows. A ``dsa.SlotAuditor`` records every
store's slots with their owners and the keys the store was given (``values=``: the expected digest
is what the real row meant to write, so a padded row that hits a real row's slot in the same step
is counted too), and verifies all watched slots after each round.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import dsa

PAGE = dsa.PAGE_SIZE
BUCKET = 8  # the captured batch size
FIRST_BATCH = 8
REAL_ROWS = 3  # the batch after 5 sessions finish
DECODE_STEPS = 4


@dataclass
class Session:
    sid: int
    pages: List[int] = field(default_factory=list)
    length: int = 0


class Arrays:
    """What the loop needs from an array library: numpy on the CPU, torch on CUDA."""

    name = "?"

    def pool(self, pages: int): ...
    def static_int64(self, n: int): ...
    def static_f32(self, rows: int, cols: int): ...
    def int32_scalar(self): ...
    def set_rows(self, buf, values, rows: int) -> None: ...
    def set_scalar(self, buf, value: int) -> None: ...
    def unguarded_store(self, pool, loc, k) -> None: ...
    def to_int(self, scalar) -> int: ...
    def capture(self, step: Callable[[], None]) -> Callable[[], None]: ...


class Runner:
    """Eager: one store at the real batch size. Graph: the step recorded once at BUCKET rows over
    static buffers; each replay rewrites only the real rows (stale padding)."""

    def __init__(self, xp: Arrays, pool, store: str, mode: str):
        self.xp, self.pool, self.store, self.mode = xp, pool, store, mode
        self.loc = xp.static_int64(BUCKET)
        self.k = xp.static_f32(BUCKET, 128)
        self.n_real = xp.int32_scalar()
        self.errors = xp.int32_scalar()
        self.replay = None

    def _store(self, loc, k, n_real):
        if self.store == "unguarded":
            self.xp.unguarded_store(self.pool, loc, k)  # the incident's one line
        else:
            dsa.store_index_k(self.pool, loc, k, n_real, errors=self.errors)

    def step(self, slots: List[int], k_rows):
        """Stores the rows; returns the keys the store was given for the real rows."""
        rows = len(slots)
        if self.mode == "eager":
            loc = self.xp.static_int64(rows)
            k = self.xp.static_f32(rows, 128)
            self.xp.set_rows(loc, slots, rows)
            self.xp.set_rows(k, k_rows, rows)
            n_real = self.xp.int32_scalar()
            self.xp.set_scalar(n_real, rows)
            self._store(loc, k, n_real)
            return k
        self.xp.set_rows(self.loc, slots, rows)  # rows [rows, BUCKET) keep the last replay's
        self.xp.set_rows(self.k, k_rows, rows)
        self.xp.set_scalar(self.n_real, rows)
        if self.replay is None:
            self.replay = self.xp.capture(lambda: self._store(self.loc, self.k, self.n_real))
        self.replay()
        return self.k[:rows]


def run(xp: Arrays, store: str, mode: str, rounds: int = 10, seed: int = 1) -> Dict[str, int]:
    """Runs the loop; returns sessions, corrupted sessions, clobbered slots, store errors."""
    rng = random.Random(seed)
    pages_total = 1 + 16 * (FIRST_BATCH + 2)
    pool = xp.pool(pages_total)
    free = list(range(pages_total - 1, 0, -1))  # page 0 is reserved; pop() takes the lowest
    auditor = dsa.SlotAuditor([pool])
    runner = Runner(xp, pool, store, mode)
    next_sid = 0
    sessions_seen = 0
    corrupted = set()
    clobbered = 0

    def new_session() -> Session:
        nonlocal next_sid, sessions_seen
        next_sid += 1
        sessions_seen += 1
        return Session(next_sid)

    def slot_for(s: Session) -> int:
        if s.length // PAGE >= len(s.pages):
            s.pages.append(free.pop())
        slot = s.pages[s.length // PAGE] * PAGE + s.length % PAGE
        s.length += 1
        return slot

    def random_k(rows: int):
        return [[rng.uniform(-2.0, 2.0) for _ in range(128)] for _ in range(rows)]

    def prefill(s: Session, tokens: int) -> None:
        slots = [slot_for(s) for _ in range(tokens)]
        k = xp.static_f32(tokens, 128)
        xp.set_rows(k, random_k(tokens), tokens)
        for i in range(0, tokens, BUCKET):  # eager, guarded: prefill is not the suspect
            chunk = slots[i : i + BUCKET]
            loc = xp.static_int64(len(chunk))
            xp.set_rows(loc, chunk, len(chunk))
            dsa.store_index_k(pool, loc, k[i : i + BUCKET], len(chunk))
        auditor.record(slots, s.sid, values=k)

    def decode(batch: List[Session]) -> None:
        slots = [slot_for(s) for s in batch]
        k = runner.step(slots, random_k(len(batch)))
        auditor.record(slots, [s.sid for s in batch], values=k)

    def finish(s: Session) -> None:
        auditor.release(owner=s.sid)
        free.extend(reversed(s.pages))  # last freed, first reused
        s.pages.clear()

    for _ in range(rounds):
        batch = [new_session() for _ in range(FIRST_BATCH)]
        for s in batch:
            prefill(s, rng.randint(1, 100))
        for _ in range(DECODE_STEPS):
            decode(batch)
        keep, done = batch[:REAL_ROWS], batch[REAL_ROWS:]
        for s in done:
            finish(s)
        waiting = [new_session() for _ in done]
        for s in waiting:
            prefill(s, rng.randint(32, 128))
        for _ in range(DECODE_STEPS):
            decode(keep)
        findings = auditor.verify("all")
        clobbered += len(findings)
        corrupted.update(f.owner for f in findings)
        for s in keep + waiting:
            finish(s)
    return {
        "sessions": sessions_seen,
        "corrupted": len(corrupted),
        "clobbered_slots": clobbered,
        "store_errors": xp.to_int(runner.errors),
    }


CONDITIONS = [
    ("unguarded", "graph"),
    ("guarded", "graph"),
    ("unguarded", "eager"),
    ("guarded", "eager"),
]


def table(xp: Arrays, rounds: int = 10, seed: int = 1) -> List[Dict[str, object]]:
    rows = []
    for store, mode in CONDITIONS:
        r = run(xp, store, mode, rounds, seed)
        rows.append({"store": store, "mode": mode, **r})
    return rows


def print_table(rows, title: str) -> None:
    print(f"## {title}\n")
    print("| condition | corrupted sessions (k/N) | clobbered slots (auditor) | store errors |")
    print("|---|---|---|---|")
    for r in rows:
        cond = f"{'unguarded index_put_' if r['store'] == 'unguarded' else 'dsa.store_index_k'}"
        cond += f" + {'graph (bucket 8, 3 real rows)' if r['mode'] == 'graph' else 'eager'}"
        pct = 100.0 * r["corrupted"] / r["sessions"]
        print(f"| {cond} | {r['corrupted']}/{r['sessions']} ({pct:.0f}%) | "
              f"{r['clobbered_slots']} | {r['store_errors']} |")
