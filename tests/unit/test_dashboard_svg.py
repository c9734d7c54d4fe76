import math

from controlplane.dashboard.svg import line_chart


def test_gaps_break_the_line_instead_of_drawing_zero():
    chart = line_chart([1.0, None, 2.0, 3.0], width=40, height=10, y_max=4)
    assert len(chart.paths) == 2
    assert chart.paths[0].count(",") == 1 and chart.paths[1].count(",") == 2
    assert chart.last == 3.0


def test_no_data_at_all_gives_no_path_and_no_last_value():
    chart = line_chart([None, None])
    assert chart.paths == [] and chart.last is None


def test_nan_and_inf_are_gaps():
    chart = line_chart([math.nan, 1.0, math.inf])
    assert len(chart.paths) == 1 and chart.last == 1.0


def test_target_line_position_and_scale_includes_target():
    chart = line_chart([10.0, 20.0], height=22, target=40.0)
    assert chart.y_max == 40.0
    assert chart.target_y == 1.0  # top of the plot area


def test_values_are_clamped_to_the_plot():
    chart = line_chart([5.0, -1.0], width=12, height=12, y_max=1.0)
    ys = [float(p.split(",")[1]) for p in chart.paths[0][1:].split(" L")]
    assert min(ys) >= 1.0 and max(ys) <= 11.0


def test_single_sample_is_drawn():
    assert line_chart([0.5]).paths[0].startswith("M1.0,")


def test_timeline_places_events_and_drops_those_outside():
    from controlplane.dashboard.svg import timeline

    marks = timeline([(0, "a", "applied"), (50, "b", "failed"), (150, "c", "applied")],
                     start=0, end=100, width=108)
    assert [(m.x, m.label, m.kind) for m in marks] == [(4.0, "a", "applied"),
                                                         (54.0, "b", "failed")]
