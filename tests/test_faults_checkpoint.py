"""A damaged checkpoint is reported in one line: the missing file, or the storage status naming the
damaged file, never the TensorStore spec that comes with it."""

from __future__ import annotations

import os

from moejax.train.checkpoint_damage import unreadable_reason

SPEC = "{\n  'driver': 'zarr',\n" + "  'kvstore': {...},\n" * 500 + "})>."


def _step_dir(tmp_path, *missing):
    for name in ("state/_METADATA", "meta/metadata", "data/metadata"):
        if name not in missing:
            os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
            (tmp_path / name).write_text("{}")
    return str(tmp_path)


def test_the_storage_status_naming_the_file_is_the_reason(tmp_path):
    step_dir = _step_dir(tmp_path)
    cause = ValueError(f'OUT_OF_RANGE: Error reading "params.embed_vd/0.0" in OCDBT database at local file '
                       f'"{step_dir}/state/": Requested byte range [24825, 57071) is not valid for value of size 100')
    try:
        try:
            raise cause
        except ValueError as e:
            raise Exception("Encountered error while reading array index: (slice(0, 272, 1),). See full "
                            f"TensorStore details: <bound method spec of TensorStore({SPEC}") from e
    except Exception as error:  # noqa: BLE001
        reason = unreadable_reason(step_dir, error)
    assert reason == str(cause)
    assert "\n" not in reason and "TensorStore" not in reason


def test_a_missing_metadata_file_is_named(tmp_path):
    step_dir = _step_dir(tmp_path, "state/_METADATA")
    assert unreadable_reason(step_dir, TypeError("'NoneType' object is not iterable")) == (
        f"missing {os.path.join(step_dir, 'state/_METADATA')}")


def test_a_long_message_is_cut_to_one_line(tmp_path):
    reason = unreadable_reason(_step_dir(tmp_path), RuntimeError("x" * 1000 + "\nsecond line"))
    assert reason.startswith("RuntimeError: xxx") and reason.endswith("...") and len(reason) < 450


def test_only_the_late_reports_of_a_failed_read_are_dropped(monkeypatch):
    import sys
    import types

    from moejax.train.checkpoint_damage import quiet_closed_loop_callbacks

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    quiet_closed_loop_callbacks()
    quiet_closed_loop_callbacks()  # once is enough: not wrapped twice
    report = lambda exc: types.SimpleNamespace(exc_value=exc)  # noqa: E731
    sys.unraisablehook(report(RuntimeError("Event loop is closed")))
    sys.unraisablehook(report(Exception("Encountered error while reading array index: (slice(0, 1, 1),). See full "
                                        f"TensorStore details: <bound method spec of TensorStore({SPEC}")))
    sys.unraisablehook(report(RuntimeError("something else")))
    assert [str(r.exc_value) for r in seen] == ["something else"]
