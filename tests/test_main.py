"""python -m gemmbn runs its check and its time table (small size, so quick anywhere)."""

from gemmbn.__main__ import main


def test_main_checks_pass_and_prints_table(capsys):
    status = main(["--size", "64", "32", "16", "--iters", "10", "--no-compile"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "PASS" in printed and "FAIL" not in printed
    assert "gemmbn ms" in printed and "eager ms" in printed
    assert "tolerance:" in printed
