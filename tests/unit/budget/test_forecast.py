"""The run's forecast (budget/forecast.py): each job's Snakemake priority by its tiers."""

from __future__ import annotations

from cs336_systems.budget import forecast


class Wildcards(dict):
    pass


def value(width, seconds=100.0, gates=False, cards=4):
    p = forecast.priority("r", lambda wc: width, lambda rule, wc: seconds, gates, cards)
    return p(Wildcards())


def test_priority_tiers_every_card_then_gates_then_wide_then_gpu_seconds():
    order = [
        value(4, seconds=30),  # every card: first, while the start frees them all
        value(1, seconds=20, gates=True),  # the ceilings: others wait for it
        value(2, seconds=10),  # two cards, freed together, go to the next wide job
        value(1, seconds=400),  # the longest single-card job
        value(1, seconds=100),
    ]
    assert order == sorted(order, reverse=True) and len(set(order)) == 5
    assert value(1, seconds=100) == 100 and value(2, seconds=100) == 200 + forecast.WIDE_PRIORITY


def test_on_two_cards_a_two_card_job_takes_every_card():
    assert value(2, cards=2) > value(1, gates=True, cards=2) > value(1, cards=2)
    assert value(0, cards=0) == 100  # a CPU job: its seconds
