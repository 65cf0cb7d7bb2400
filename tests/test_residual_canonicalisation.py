"""Unit tests of residual canonicalisation (conformance.ir.residuals), numpy only, no framework runs.

Pinned: when a saved array equals a program value (`matches`: same layout, an axis permutation of a
2-d or 3-d value, or a reshape of the same elements in the same order, within a few ulps of the
coarser dtype and no looser); how `canonicalise` splits a stack of scan-iteration values into one
residual per iteration (and when it must not); how copies of one value merge (per dtype); and what
each residual records (names, exact, memory, copies)."""
from __future__ import annotations

import numpy as np

from conformance.ir.nodes import NodeInfo
from conformance.ir.residuals import canonicalise, matches

A23 = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])   # distinct elements: every relayout reorders them
A234 = np.arange(1.0, 25.0).reshape(2, 3, 4)


def rows(res):
    """What a residual list says, field by field, in canonical order."""
    return [(r.cls, r.shape, r.dtype, r.copies, r.exact, r.names, r.memory) for r in res]


def info(i, name):
    return NodeInfo(id=i, path=f"body/{i}", op="name", name=name, region_depth=1, ctx="main")


# -- matches ----------------------------------------------------------------------------------------
def test_a_value_matches_itself_and_not_other_elements_of_the_same_shape():
    assert matches(A23, A23.copy())
    assert not matches(A23, A23 + 1.0)
    assert not matches(np.array([1.0, 2.0]), np.array([2.0, 1.0]))


def test_a_transposed_2d_value_matches_but_other_elements_in_the_transposed_shape_do_not():
    assert matches(A23.T.copy(), A23)
    assert not matches(A23.T + 1.0, A23)
    # a square value: the identity permutation has the saved shape but not its elements
    sq = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert matches(sq.T.copy(), sq)
    assert not matches(sq + 1.0, sq)


def test_a_3d_value_matches_under_every_axis_permutation():
    for perm in ((2, 0, 1), (1, 2, 0), (0, 2, 1), (2, 1, 0)):
        assert matches(np.ascontiguousarray(A234.transpose(perm)), A234), perm


def test_a_4d_value_matches_only_as_itself_or_a_reshape_never_as_a_permutation():
    v = np.arange(1.0, 121.0).reshape(2, 3, 4, 5)
    assert matches(v.copy(), v)
    assert matches(v.reshape(6, 20), v)
    assert not matches(np.ascontiguousarray(v.transpose(1, 0, 2, 3)), v)


def test_a_reshape_of_the_same_elements_in_order_matches_in_both_directions():
    assert matches(A23.reshape(-1), A23)
    assert matches(A23, A23.reshape(-1))
    # both sides multi-dimensional: (2, 3) and (3, 2) in row-major order are not transposes of each other
    assert matches(A23, A23.reshape(3, 2))
    assert matches(A234.reshape(6, 4), A234)


def test_a_reordering_that_is_neither_permutation_nor_reshape_does_not_match():
    assert not matches(A23.reshape(-1)[::-1].copy(), A23)
    assert not matches(A23[::-1].copy(), A23)   # rows swapped: same shape, same elements, another order
    assert not matches(np.ones(5), np.ones(6))


def test_matching_tolerance_is_a_few_ulps_of_the_coarser_dtype_whichever_side_it_is_on():
    x64 = np.array([1.0, 2.0, 3.0])
    off = (x64 * (1 + 2e-6)).astype(np.float32)   # within float32's 1e-5, far outside float64's 1e-10
    assert matches(off, x64)                      # saved in float32
    assert matches(x64 * (1 + 2e-6), x64.astype(np.float32))   # the value in float32
    assert not matches(x64 * (1 + 2e-6), x64)     # both float64


def test_float64_matching_is_tight_relatively_and_absolutely():
    big = np.array([1000.0, 2000.0])
    assert matches(big * (1 + 1e-11), big)
    assert not matches(big * (1 + 1e-7), big)    # numpy's default rtol (1e-5) would accept it
    assert matches(np.array([0.0, 5e-11]), np.zeros(2))
    assert not matches(np.array([0.0, 1e-9]), np.zeros(2))   # numpy's default atol (1e-8) would accept it


# -- canonicalise: classes, copies, recorded fields -------------------------------------------------
def test_a_saved_array_records_its_class_names_exact_members_shape_dtype_bytes_and_memory():
    values = {"a": A23, "t": A23.T.copy(), "u": np.zeros(3)}
    index = {"a": info("a", "act"), "t": info("t", None), "z": info("z", "zz")}
    [r] = canonicalise([A23.copy()], values, index, memory=["pinned_host"])
    assert (r.cls, r.exact, r.names) == (["a", "t"], ["a"], ["act"])
    assert (r.shape, r.dtype, r.bytes, r.memory, r.copies) == ([2, 3], "float64", 48, "pinned_host", 1)
    # in the transposed layout the other member is the exact one
    [r] = canonicalise([A23.T.copy()], values, index)
    assert (r.cls, r.exact, r.memory) == (["a", "t"], ["t"], None)


def test_a_reshaped_save_belongs_to_its_class_but_equals_no_member_exactly():
    [r] = canonicalise([A23.reshape(-1)], {"a": A23}, {})
    assert (r.cls, r.exact, r.shape) == (["a"], [], [6])
    [r] = canonicalise([A23.T.copy()], {"a": A23}, {})
    assert (r.cls, r.exact, r.shape) == (["a"], [], [3, 2])


def test_names_are_the_sorted_distinct_checkpoint_names_of_the_class():
    values = {"p": A23, "q": A23, "r": A23, "s": A23}
    index = {"p": info("p", "b"), "q": info("q", "a"), "r": info("r", "b")}
    [r] = canonicalise([A23], values, index)
    assert (r.cls, r.names) == (["p", "q", "r", "s"], ["a", "b"])


def test_copies_of_one_value_in_one_dtype_are_one_residual_counted_per_copy():
    values = {"a": A23, "b": A23 * 2}
    res = canonicalise([A23, A23.copy(), A23 * 2, A23.copy()], values, {}, memory=["device", "pinned_host", None, None])
    # the first copy's record stands (its memory kind)
    assert rows(res) == [(["a"], [2, 3], "float64", 3, ["a"], [], "device"),
                         (["b"], [2, 3], "float64", 1, ["b"], [], None)]


def test_one_value_saved_in_two_dtypes_is_two_residuals():
    res = canonicalise([A23, A23.astype(np.float32)], {"a": A23}, {})
    assert rows(res) == [(["a"], [2, 3], "float32", 1, ["a"], [], None),
                         (["a"], [2, 3], "float64", 1, ["a"], [], None)]


def test_arrays_that_match_no_value_stay_apart_even_when_equal():
    res = canonicalise([np.ones(3), np.ones(3)], {"a": A23}, {})
    assert rows(res) == [([], [3], "float64", 1, [], [], None)] * 2


def test_the_memory_kind_is_taken_by_position():
    res = canonicalise([A23, A23 * 2], {"a": A23, "b": A23 * 2}, {}, memory=[None, "pinned_host"])
    assert [(r.cls, r.memory) for r in res] == [(["a"], None), (["b"], "pinned_host")]


# -- canonicalise: stacks of scan iterations -------------------------------------------------------
def test_a_stack_of_iteration_values_is_one_residual_per_iteration():
    values = {"v@0": np.array([1.0, 2.0]), "v@1": np.array([3.0, 4.0])}
    res = canonicalise([np.array([[1.0, 2.0], [3.0, 4.0]])], values, {}, memory=["device"])
    assert rows(res) == [(["v@0"], [2], "float64", 1, ["v@0"], [], "device"),
                         (["v@1"], [2], "float64", 1, ["v@1"], [], "device")]


def test_a_stack_of_scalar_iteration_values_splits_into_scalars():
    values = {"c@0": np.array(1.5), "c@1": np.array(2.5), "x": np.array([7.0, 8.0])}
    res = canonicalise([np.array([1.5, 2.5])], values, {})
    assert [(r.cls, r.shape) for r in res] == [(["c@0"], []), (["c@1"], [])]


def test_a_stack_that_also_equals_a_value_as_a_whole_still_splits():
    # a scan's stacked ys equal the stack of its iterations' values
    values = {"v@0": np.array([1.0, 2.0]), "v@1": np.array([3.0, 4.0]), "ys": np.array([[1.0, 2.0], [3.0, 4.0]])}
    res = canonicalise([np.array([[1.0, 2.0], [3.0, 4.0]])], values, {})
    assert [(r.cls, r.shape) for r in res] == [(["v@0"], [2]), (["v@1"], [2])]


def test_an_input_whose_rows_a_loop_reads_is_that_input_not_a_stack():
    """A 30-minute campaign's residual-report finding: x0 (named 'a') saved for a mul, its first element a value v2
    and its second a scan iteration's value: read as a stack of those two scalars, the name JAX's report prints was
    not among the closure's. A program input or an op's output (the index knows it) in its own shape is itself."""
    from conformance.ir.nodes import NodeInfo
    values = {"x0": np.array([-0.5, 0.25]), "v1": np.array([-0.5, 0.25]), "v2": np.array(-0.5),
              "v10@0": np.array(0.25)}
    index = {"x0": NodeInfo("x0", "inputs[0]", "input", None, 0, "main"),
             "v1": NodeInfo("v1", "body[0]", "name", "a", 0, "main"),
             "v2": NodeInfo("v2", "body[1]", "select", None, 0, "main")}
    [r] = canonicalise([np.array([-0.5, 0.25])], values, index)
    assert (r.cls, r.shape, r.names) == (["v1", "x0"], [2], ["a"])
    # a scan's stacked result is in no index: its stack still splits (above)


def test_an_iteration_value_saved_in_its_own_layout_is_not_split_into_its_rows():
    # a [1, 3] value of a loop whose single row equals another iteration's value
    values = {"v@0": np.array([[1.0, 2.0, 3.0]]), "w@0": np.array([1.0, 2.0, 3.0])}
    [r] = canonicalise([np.array([[1.0, 2.0, 3.0]])], values, {})
    assert (r.cls, r.shape, r.exact) == (["v@0", "w@0"], [1, 3], ["v@0"])


def test_rows_that_equal_only_values_outside_a_loop_are_no_stack():
    values = {"a": np.array([1.0, 2.0]), "b": np.array([3.0, 4.0]), "v@0": np.array([9.0, 9.0])}
    [r] = canonicalise([np.array([[1.0, 2.0], [3.0, 4.0]])], values, {})
    assert (r.cls, r.shape) == ([], [2, 2])


def test_a_stack_with_one_row_matching_nothing_is_kept_whole():
    values = {"v@0": np.array([1.0, 2.0]), "v@1": np.array([3.0, 4.0])}
    [r] = canonicalise([np.array([[1.0, 2.0], [5.0, 6.0]])], values, {})
    assert (r.cls, r.shape) == ([], [2, 2])


def test_rows_mixing_loop_and_outside_values_split():
    values = {"v@0": np.array([1.0, 2.0]), "a": np.array([3.0, 4.0])}
    res = canonicalise([np.array([[1.0, 2.0], [3.0, 4.0]])], values, {})
    assert [(r.cls, r.shape) for r in res] == [(["a"], [2]), (["v@0"], [2])]


def test_without_iteration_values_a_stack_of_program_values_is_kept_whole():
    values = {"a": np.array([1.0, 2.0]), "b": np.array([3.0, 4.0]), "ab": np.array([[1.0, 2.0], [3.0, 4.0]])}
    [r] = canonicalise([np.array([[1.0, 2.0], [3.0, 4.0]])], values, {})
    assert (r.cls, r.shape) == (["ab"], [2, 2])


def test_iterations_saved_both_stacked_and_one_by_one_merge_as_copies():
    values = {"v@0": np.array([1.0, 2.0]), "v@1": np.array([3.0, 4.0])}
    res = canonicalise([np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([3.0, 4.0])], values, {})
    assert [(r.cls, r.copies) for r in res] == [(["v@0"], 1), (["v@1"], 2)]
