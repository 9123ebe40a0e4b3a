"""The rewriter that scopes rule expressions: selectors on every series, the cluster in by / on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.promscope.promql import KEYWORDS, PromQLError, Scope, apply, check_selector

SCOPE = Scope(selector='job="g"', cluster_label="cluster")


def test_a_bare_series_gets_the_selector():
    assert apply("gpu_up == 0", SCOPE) == 'gpu_up{job="g"} == 0'


def test_existing_matchers_keep_their_place_after_the_selector():
    assert apply('gpu_info{mig_mode!="enabled"}', SCOPE) == 'gpu_info{job="g", mig_mode!="enabled"}'


def test_functions_aggregations_and_keywords_are_not_series():
    expr = "max_over_time(gpu_up[1d:10m]) and on (instance) vector(time()) offset 5m"
    assert apply(expr, SCOPE) == (
        'max_over_time(gpu_up{job="g"}[1d:10m]) and on (cluster, instance) vector(time()) offset 5m'
    )


def test_by_and_on_lists_get_the_cluster_label_once():
    expr = "sum by (instance, job) (x) / on (cluster, instance) group_left (model) y"
    assert apply(expr, SCOPE) == (
        'sum by (cluster, instance, job) (x{job="g"}) / on (cluster, instance) group_left (model) y{job="g"}'
    )


def test_without_ignoring_and_group_lists_stay_as_they_are():
    expr = "max without (scope) (x) * ignoring (xid) group_right (a) y"
    assert (
        apply(expr, SCOPE) == 'max without (scope) (x{job="g"}) * ignoring (xid) group_right (a) y{job="g"}'
    )


def test_an_empty_on_list_becomes_the_cluster():
    assert apply("a * on () group_left () b", SCOPE) == 'a{job="g"} * on (cluster) group_left () b{job="g"}'


def test_numbers_durations_strings_and_comments_are_left_alone():
    expr = 'rate(x{l="a b or c"}[5m]) * 60 > 0.24 * 2 ^ (y - 2) # not_a_series\n'
    assert (
        apply(expr, SCOPE)
        == 'rate(x{job="g", l="a b or c"}[5m]) * 60 > 0.24 * 2 ^ (y{job="g"} - 2) # not_a_series\n'
    )


def test_recorded_series_keep_the_labels_their_rule_gave_them():
    # level:metric:operations series were scoped when recorded; a model: series has no job at all
    assert apply("model:gpu_gpus:count > 0", SCOPE) == "model:gpu_gpus:count > 0"


def test_an_aggregation_without_grouping_is_one_per_cluster():
    assert apply("sum(x) or vector(0)", SCOPE) == 'sum by (cluster) (x{job="g"}) or vector(0)'


def test_a_trailing_grouping_gets_the_cluster_and_no_second_one():
    assert apply("sum(x) by (a)", SCOPE) == 'sum(x{job="g"}) by (cluster, a)'


def test_another_component_s_series_take_their_own_selector():
    scope = Scope(selector='job="g"', cluster_label="", overrides=(("gpulens_remediate_", 'job="r"'),))
    assert apply("gpulens_remediate_x / gpu_y", scope) == 'gpulens_remediate_x{job="r"} / gpu_y{job="g"}'


def test_layout_is_kept_line_for_line():
    expr = "a\n  or on (gpu)\n  b\n"
    assert apply(expr, SCOPE) == 'a{job="g"}\n  or on (cluster, gpu)\n  b{job="g"}\n'


def test_an_unterminated_string_is_an_error():
    with pytest.raises(PromQLError, match="unterminated string"):
        apply('x{a="b}', SCOPE)


def test_a_selector_must_be_label_matchers():
    with pytest.raises(PromQLError, match="expected label matchers"):
        check_selector("up == 0")


IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(lambda s: s not in KEYWORDS)


@given(st.lists(IDENT, min_size=1, max_size=6))
def test_an_empty_scope_changes_nothing(names):
    expr = " or on (gpu) ".join(f"sum by (instance) ({name})" for name in names)
    assert apply(expr, Scope(selector="", cluster_label="")) == expr


@given(st.lists(IDENT, min_size=1, max_size=6))
def test_every_series_of_a_union_gets_the_selector(names):
    expr = " or ".join(names)
    scoped = apply(expr, SCOPE)
    assert scoped == " or ".join(f'{name}{{job="g"}}' for name in names)
