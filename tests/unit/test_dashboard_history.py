"""Layout and measured p95 vs target over hours, from the planner's observations."""

from controlplane.dashboard.history import (
    MAX_POINTS,
    Point,
    history_chart,
    point_from_record,
)

H = 3600.0


def test_bands_change_where_the_layout_label_changes_and_lines_break_on_gaps():
    points = [Point(1 * H, "aggregated", 0.8, 0.054), Point(2 * H, "aggregated", 0.9, None),
              Point(3 * H, "2P:6D", 1.1, 0.031), Point(4 * H, "2P:6D", 1.0, 0.030)]
    c = history_chart(points, start=0, end=6 * H, ttft_target_s=2.5, itl_target_s=0.05,
                      width=608)
    assert [b.label for b in c.bands] == ["aggregated", "2P:6D"]
    assert c.bands[0].x0 == 104.0 and c.bands[0].x1 == c.bands[1].x0 == 304.0
    assert c.bands[1].x1 == 604.0  # the last layout holds to the end of the axis
    assert len(c.ttft.paths) == 1 and len(c.itl.paths) == 2  # the gap breaks the ITL line
    assert c.itl.over == 1 and c.itl.last == 0.030 and c.ttft.over == 0
    # The target is drawn and scaled with the values: 54 ms is above the 50 ms line.
    first_itl_y = c.itl.dots[0][1]
    assert c.itl.target_y is not None and first_itl_y < c.itl.target_y


def test_bounded_to_the_window_and_the_newest_points():
    points = [Point(t, "A", 0.1, 0.01) for t in range(-100, 2 * MAX_POINTS)]
    c = history_chart(points, start=0, end=10 * MAX_POINTS, ttft_target_s=None,
                      itl_target_s=None)
    assert c.points == MAX_POINTS and len(c.ttft.dots) == MAX_POINTS
    assert c.ttft.dots[0][0] > 4  # the oldest kept point is MAX_POINTS s in, not at 0
    assert c.ttft.target_y is None


def test_empty_history_and_unknown_measurements():
    c = history_chart([], start=0, end=H, ttft_target_s=2.5, itl_target_s=0.05)
    assert c.bands == [] and c.ttft.paths == [] and c.ttft.last is None
    p = point_from_record({"observe": {"layout_label": "1P:3D", "measured_ttft_p95_ms": 420,
                                       "measured_itl_p95_ms": None}}, at=5.0)
    assert p == Point(5.0, "1P:3D", 0.42, None)
    assert point_from_record({}, at=1.0, fallback_layout="A8") == Point(1.0, "A8", None, None)
    assert point_from_record(None, at=1.0) is None
