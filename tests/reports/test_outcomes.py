"""Cascade vs --every-attack scoring follows the run's recorded config, not a guess from the records."""
from harness.reports.outcomes import outcome_table
from harness.reports.synthetic import synthetic_records


def test_cascade_without_skips_is_still_cumulative():
    # every attack attempted every sample (no skips), yet the run was a cascade: columns must not rise
    records = synthetic_records(n=200, robust=(("a", 0.3), ("b", 0.6)), cascade=False, seed=1)
    assert records.loc[records["stage"] > 0, "attempted"].all()
    cascade = outcome_table(records, config={"every_attack": False})
    alone = outcome_table(records, config={"every_attack": True})
    assert cascade.attrs["cumulative"] and not alone.attrs["cumulative"]
    assert cascade["b"].mean() <= cascade["a"].mean()
    assert alone["b"].mean() > alone["a"].mean()  # scored alone, the weaker attack b shows higher accuracy
    assert (cascade["worst-case"] == alone["worst-case"]).all()
