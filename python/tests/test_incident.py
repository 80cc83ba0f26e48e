"""The incident's fingerprint on the CPU: only the unguarded scatter under fixed-size replay with
stale padding corrupts sessions, and the auditor names them; dsa.store_index_k and eager mode
corrupt none."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import incident_numpy  # noqa: E402
import incident_scenario as scenario  # noqa: E402


def test_fingerprint_of_the_incident():
    rows = {(r["store"], r["mode"]): r for r in scenario.table(incident_numpy.NumpyArrays(), 4)}
    bad = rows[("unguarded", "graph")]
    assert bad["corrupted"] > 0 and bad["clobbered_slots"] >= bad["corrupted"]
    for cond in [("guarded", "graph"), ("unguarded", "eager"), ("guarded", "eager")]:
        assert rows[cond]["corrupted"] == 0, cond
        assert rows[cond]["clobbered_slots"] == 0, cond
        assert rows[cond]["sessions"] == bad["sessions"]


def test_guarded_graph_store_reports_no_errors():
    r = scenario.run(incident_numpy.NumpyArrays(), "guarded", "graph", rounds=2)
    assert r["store_errors"] == 0
