"""Bad input gets a clear ValueError/TypeError when the expression is built, naming
the relation, the dims and what would be valid."""

import numpy as np
import pytest

import tra_dask as td
from tra_dask.keys import k0, k1


@pytest.fixture
def A():
    return td.from_numpy(np.ones((4, 6)), (2, 3), name="A")


@pytest.fixture
def B():
    return td.from_numpy(np.ones((6, 4)), (3, 2), name="B")


# -- dims out of range ------------------------------------------------------

def test_join_left_dim_out_of_range(A, B):
    with pytest.raises(ValueError, match=r"left_on dim 2 is out of range for A \(key arity 2\); valid key dims are 0\.\.1"):
        td.join(A, B, (2,), (0,), "matmul")


def test_join_right_dim_out_of_range(A, B):
    with pytest.raises(ValueError, match=r"right_on dim 5 is out of range for B .*valid key dims are 0\.\.1"):
        td.join(A, B, (1,), (5,), "matmul")


def test_aggregate_dim_out_of_range(A):
    with pytest.raises(ValueError, match=r"aggregate\(A.*group_by dim 3 is out of range for A .*valid key dims are 0\.\.1"):
        td.aggregate(A, (0, 3), "add")


def test_aggregate_repeated_dim(A):
    with pytest.raises(ValueError, match=r"group_by \(0, 0\) repeats a dim"):
        td.aggregate(A, (0, 0), "add")


def test_tile_dim_out_of_range(A):
    with pytest.raises(ValueError, match=r"tile\(A.*tile_dim dim 2 is out of range for A \(chunk rank 2\); valid array dims are 0\.\.1"):
        td.tile(A, 2, 1)


def test_tile_size_not_positive(A):
    with pytest.raises(ValueError, match=r"tile_size must be a positive int, got 0"):
        td.tile(A, 0, 0)


def test_concat_key_dim_out_of_range(A):
    with pytest.raises(ValueError, match=r"concat\(A.*key_dim dim 2 is out of range for A \(key arity 2\)"):
        td.concat(A, 2, 0)


def test_concat_array_dim_out_of_range(A):
    with pytest.raises(ValueError, match=r"array_dim dim 4 is out of range for A \(chunk rank 2\); valid array dims are 0\.\.1"):
        td.concat(A, 0, 4)


def test_concat_of_mismatched_chunks(A):
    # concatenating along dim 1 the chunks stacked by key dim 0 (the row blocks)
    # works only when they agree on dim 0: here 2 == 2, fine; a ragged grid is not
    C = td.from_numpy(np.ones((5, 6)), (2, 3), name="C")  # row blocks 2, 2, 1
    with pytest.raises(ValueError, match=r"differ outside array dim 1"):
        td.concat(C, 0, 1)


def test_filter_reads_missing_dim(A):
    with pytest.raises(ValueError, match=r"filter\(A.*reads key dim 2 but A has key arity 2; valid key dims are 0\.\.1"):
        td.filter(A, td.k[2] == 0)


# -- join dims ------------------------------------------------------------------

def test_join_on_lists_of_different_length(A, B):
    with pytest.raises(ValueError, match=r"left_on \(0, 1\) and right_on \(0,\) have different lengths"):
        td.join(A, B, (0, 1), (0,), "add")


def test_join_dims_with_different_key_ranges(A):
    B3 = td.from_numpy(np.ones((6, 4)), (2, 2), name="B3")  # 3 row blocks vs A's 2 column blocks
    with pytest.raises(ValueError, match=r"left key dim 1 of A takes 0\.\.1 but right key dim 0 of B3 takes 0\.\.2"):
        td.join(A, B3, (1,), (0,), "matmul")


def test_join_dims_with_different_chunk_extents(A):
    # same number of blocks (2) along the joined dims, but 3+3 columns vs 4+2 rows
    B42 = td.from_numpy(np.ones((6, 4)), (4, 2), name="B42")
    with pytest.raises(ValueError, match=r"chunk \(0, 0\) of A \(shape \(2, 3\)\) and chunk \(0, 0\) of B42 \(shape \(4, 2\)\) do not fit: .*inner dims differ"):
        td.join(A, B42, (1,), (0,), "matmul")


def test_kernel_shapes_do_not_fit():
    L = td.from_numpy(np.ones((2, 3)), (2, 3), name="L")
    R = td.from_numpy(np.ones((4, 5)), (4, 5), name="R")
    with pytest.raises(ValueError, match=r"shape \(2, 3\).*shape \(4, 5\).*A @ B of \(2, 3\) and \(4, 5\) needs 3 == 4"):
        td.join(L, R, (), (), "matmul")


def test_aggregate_kernel_must_keep_type(A):
    with pytest.raises(ValueError, match=r"aggregation kernel must return chunks of its input type|inner dims differ"):
        td.aggregate(A, (0,), "matmul")  # (2,3) @ (2,3) does not even fit


def test_transform_kernel_shape_error():
    v = td.from_numpy(np.ones(4), 2, name="v")
    with pytest.raises(ValueError, match=r"transform\(v, kernel='row_sum'\).*needs 2-d chunks, got shape \(2,\)"):
        td.transform(v, "row_sum")


# -- chunks and sources -------------------------------------------------------------

@pytest.mark.parametrize("chunks,msg", [
    ((0, 2), r"chunk size 0 for dim 0 is not positive; valid chunk sizes are 1\.\.4"),
    ((2, -3), r"chunk size -3 for dim 1 is not positive"),
    (0, r"chunk size 0 for dim 0 is not positive"),
])
def test_zero_or_negative_chunks(chunks, msg):
    with pytest.raises(ValueError, match=msg):
        td.from_numpy(np.ones((4, 6)), chunks, name="Z")


def test_chunks_of_wrong_rank():
    with pytest.raises(ValueError, match=r"from_numpy Z: chunks \(2,\) have 1 entries but the tensor has rank 2"):
        td.from_numpy(np.ones((4, 6)), (2,), name="Z")
    with pytest.raises(ValueError, match=r"from_function f: chunks \(2, 2, 2\) have 3 entries but the tensor has rank 2"):
        td.from_function(lambda k: None, (4, 4), (2, 2, 2), "float64", name="f")


def test_from_chunks_mixed_ranks():
    with pytest.raises(ValueError, match=r"from_chunks M: chunks of different ranks"):
        td.from_chunks({(0,): np.ones((2, 2)), (1,): np.ones(2)}, name="M")


def test_from_chunks_with_holes():
    with pytest.raises(ValueError, match=r"from_chunks H: the keys have holes below the frontier \(2, 2\): missing \(0, 1\)"):
        td.from_chunks({(0, 0): np.ones(2), (1, 0): np.ones(2), (1, 1): np.ones(2)}, name="H")


def test_from_chunks_mixed_shapes():
    with pytest.raises(ValueError, match=r"from_chunks S: chunk \(0, 1\) has shape \(2, 3\) but chunk \(0, 0\) has \(2, 2\)"):
        td.from_chunks({(0, 0): np.ones((2, 2)), (0, 1): np.ones((2, 3))}, name="S")


def test_from_chunks_edge_chunks_are_fine():
    r = td.from_chunks({(0, 0): np.ones((2, 2)), (0, 1): np.ones((2, 1)),
                        (1, 0): np.ones((1, 2)), (1, 1): np.ones((1, 1))}, name="E")
    assert td.to_numpy(r).shape == (3, 3)


def test_from_chunks_mixed_dtypes():
    with pytest.raises(ValueError, match=r"from_chunks D: chunks of different dtypes.*float32.*float64"):
        td.from_chunks({(0,): np.ones(2), (1,): np.ones(2, dtype="float32")}, name="D")


def test_from_chunks_duplicate_key_after_normalising():
    with pytest.raises(ValueError, match=r"appears twice"):
        td.from_chunks({(0,): np.ones(2), 0: np.ones(2)})


@pytest.mark.parametrize("key", [(0.5,), ("a",), (True,), (None,)])
def test_non_integer_key(key):
    with pytest.raises(TypeError, match=r"non-integer entry"):
        td.from_chunks({key: np.ones(2)}, name="N")


def test_negative_key():
    with pytest.raises(ValueError, match=r"negative entry -1"):
        td.from_chunks({(-1,): np.ones(2)})


def test_from_numpy_empty_dim():
    with pytest.raises(ValueError, match=r"shape \(0, 3\) has an empty or negative dim"):
        td.from_numpy(np.ones((0, 3)), 1)


def test_from_function_wrong_chunk_at_evaluation():
    r = td.from_function(lambda k: np.ones((3, 3)), (4, 4), 2, "float64", name="bad")
    with pytest.raises(ValueError, match=r"from_function bad: fn\(\(0, 0\)\) returned a chunk of shape \(3, 3\).*expected shape \(2, 2\)"):
        td.evaluate(r)


# -- rekey ----------------------------------------------------------------------------

def test_rekey_duplicate_keys(A):
    with pytest.raises(ValueError, match=r"rekey\(A, key\(k0\)\): keys \(0, 0\), \(0, 1\) all map to \(0,\); a rekey must keep keys unique"):
        td.rekey(A, k0)


def test_rekey_with_opaque_callable_duplicates(A):
    with pytest.raises(ValueError, match=r"must keep keys unique"):
        td.rekey(A, lambda key: (key[0] + key[1],))


def test_rekey_non_integer_key(A):
    with pytest.raises(TypeError, match=r"key \(0\.0, 0\) has a non-integer entry 0\.0 \(float\)"):
        td.rekey(A, lambda key: (key[0] / 2, key[1]))


def test_rekey_negative_key(A):
    with pytest.raises(ValueError, match=r"maps to \(-1, 0\), which has a negative entry"):
        td.rekey(A, (k0 - 1, k1))


def test_rekey_reads_missing_dim(A):
    with pytest.raises(ValueError, match=r"reads key dim 3 but A has key arity 2"):
        td.rekey(A, (td.k[3],))


# -- kernels --------------------------------------------------------------------------

def test_unknown_kernel_name(A):
    with pytest.raises(ValueError, match=r"unknown kernel 'matmull'; did you mean 'matmul'.*Registered kernels: .*add"):
        td.join(A, A, (0,), (0,), "matmull")


def test_unary_kernel_where_binary_needed(A):
    with pytest.raises(ValueError, match=r"kernel 'relu' takes 1 chunk\(s\) but this operator needs a binary kernel"):
        td.aggregate(A, (0,), "relu")


def test_not_a_relation():
    with pytest.raises(TypeError, match=r"aggregate: the input must be a tensor relation.*got ndarray"):
        td.aggregate(np.ones(3), (), "add")


def test_predicate_must_be_boolean(A):
    with pytest.raises(TypeError, match=r"is a key expression, not a predicate"):
        td.filter(A, k0 + 1)


def test_final_result_with_holes_is_rejected(A):
    F = td.filter(A, k0 == k1)
    with pytest.raises(ValueError, match=r"keys have holes below the frontier \(2, 2\) \(missing \(0, 1\)"):
        td.evaluate(F)
    assert sorted(td.evaluate(F, check=False)) == [(0, 0), (1, 1)]


# -- found by the fuzz campaign (issue 14; tests/test_fuzz.py) ---------------------------

@pytest.mark.parametrize("shape, err, msg", [
    ((float("inf"), 2), TypeError, r"extent inf \(float\) for dim 0; extents must be ints >= 1"),
    ((float("nan"), 2), TypeError, r"extent nan \(float\)"),
    ((4.7, 2.2), TypeError, r"extent 4\.7 \(float\)"),  # was truncated to (4, 2)
    ((4.0, 2), TypeError, r"extent 4\.0 \(float\)"),
    ("12", TypeError, r"shape must be a tuple of ints, got '12' \(str\)"),  # was (1, 2)
    ((2, -3), ValueError, r"empty or negative dim"),
    ((True, 2), TypeError, r"extent True \(bool\)"),
    ((1,) * 65, ValueError, r"65 dims; a chunk is a numpy array, which has at most 64"),
])
def test_from_function_bad_shapes(shape, err, msg):
    with pytest.raises(err, match=r"from_function F: .*" + msg):
        td.from_function(lambda k: None, shape, 1, "float64", name="F")


@pytest.mark.parametrize("dtype", ["U3", object, "not a dtype"])
def test_sources_hold_numbers(dtype):
    with pytest.raises(TypeError, match=r"from_function F: "):
        td.from_function(lambda k: None, (2,), 1, dtype, name="F")
    with pytest.raises(TypeError, match=r"from_numpy\(array of shape \(2,\) <U1\): dtype <U1 is not supported"):
        td.from_numpy(np.array(["a", "b"]), 1)
    with pytest.raises(TypeError, match=r"from_chunks C: chunk \(0,\): dtype object"):
        td.from_chunks({(0,): np.array([None])}, name="C")


def test_mistyped_kernel_declarations():
    with pytest.raises(ValueError, match=r"td.kernel 'k': shape='sameish' is not a shape rule \(did you mean 'same'\?\)"):
        td.kernel(lambda x: x, name="k", shape="sameish")  # was KeyError: 'sameish'
    with pytest.raises(ValueError, match=r"td.kernel 'k': flops='elementwsie' is not a flops rule"):
        td.kernel(lambda x: x, name="k", shape="same", flops="elementwsie")
    with pytest.raises(TypeError, match=r"td.kernel 'k': shape must be one of 'same', 'broadcast' or a callable"):
        td.kernel(lambda x: x, name="k", shape=5)
    with pytest.raises(ValueError, match=r"td.kernel 'k': arity must be 1 \(transform\) or 2"):
        td.kernel(lambda x: x, name="k", arity=3)


@pytest.mark.parametrize("rule, msg", [
    (lambda s: "12", r"its shape rule returned '12'; a chunk shape is a tuple of ints >= 0"),
    (lambda s: (4.7, 2.2), r"its shape rule returned \(4\.7, 2\.2\)"),
    (lambda s: (2, -1), r"its shape rule returned \(2, -1\)"),
    (lambda s: s[5], r"its type rule raised IndexError: tuple index out of range on chunks of shape \(2, 3\)"),
])
def test_kernel_shape_rules_that_return_junk(A, rule, msg):
    k = td.kernel(lambda x: x, name="junk_rule", shape=rule, register_as=False)
    with pytest.raises(ValueError, match=r"transform\(A, kernel='junk_rule'\): kernel 'junk_rule': " + msg):
        td.transform(A, k)


def test_kernel_with_a_fixed_output_dtype(A):
    k = td.kernel(lambda x: x.astype("float32"), name="to32", shape="same", dtype="float32", register_as=False)
    C = td.transform(A, k)
    assert C.dtype == np.float32 and td.to_numpy(C).dtype == np.float32


def test_kernel_returning_objects_is_refused_when_probed(A):
    with pytest.raises(ValueError, match=r"transform\(A.*its output dtype is object"):
        td.transform(A, lambda x: np.array([None] * x.size, dtype=object).reshape(x.shape))


@pytest.mark.parametrize("fn, raised", [
    (lambda k: (k[2],), "IndexError: tuple index out of range"),
    (lambda k: (k[0] // 0,), "ZeroDivisionError: integer division or modulo by zero"),
])
def test_user_key_functions_that_raise_name_the_relation_and_key(A, fn, raised):
    with pytest.raises(ValueError, match=r"rekey\(A, <key function .*>\): <key function .*> raised " + raised
                                         + r" for key \(0, 0\)"):
        td.rekey(A, fn)
    with pytest.raises(ValueError, match=r"filter\(A, <predicate .*>\): <predicate .*> raised " + raised
                                         + r" for key \(0, 0\)"):
        td.filter(A, lambda k: fn(k) == (0,))


def test_key_values_past_int64(A):
    with pytest.raises(ValueError, match=r"rekey\(A, .*\): key expression .* overflows int64"):
        td.rekey(A, ((k0 + 2) * 2**62 + k1,))
    with pytest.raises(ValueError, match=r"key constant 36893488147419103232 does not fit in int64"):
        td.filter(A, k0 < 2**65)
    with pytest.raises(ValueError, match=r"rekey\(A, .*\): .*entry 36893488147419103232 that does not fit in int64"):
        td.rekey(A, lambda k: (k[0] * 2**65 + k[1],))


def test_bool_minus_bool_is_refused():
    Bl = td.from_numpy(np.ones((2, 2), bool), 1, name="Bl")
    with pytest.raises(ValueError, match=r"aggregate\(Bl.*cannot subtract boolean chunks"):
        td.aggregate(Bl, (), "sub")  # numpy raises on bool - bool: it would fail when it runs


def test_results_with_holes_are_refused_before_anything_runs(A):
    # the cluster path makes evaluate's check on the exact types first: no client, no
    # cluster is needed to refuse (an earlier campaign got 20 such results back)
    from tra_dask.logical import check_outputs

    F = td.filter(A, k0 == k1)
    for run in (td.submit, td.compute):
        with pytest.raises(ValueError, match=r"result filter\(A\): keys have holes below the frontier"):
            run(F)
        with pytest.raises(ValueError, match=r"holes"):
            run({"ok": td.rekey(F, k0), "holes": F})
    with pytest.raises(ValueError, match=r"holes"):
        check_outputs(td.compile(F, sites=2))  # a plan's outputs too
    check_outputs((td.rekey(F, k0), A))  # continuous: fine


def test_array_expressions_refused_when_written_not_when_run():
    x = np.ones((4, 4))
    assert td.to_numpy(td.from_array(x, chunks=2)[1:3]).shape == (2, 4)  # a re-cut (it was refused)
    with pytest.raises(ValueError, match=r"arrays cut differently along one axis"):
        td.from_array(x, chunks=2) + td.from_array(x, chunks=1)  # was raised by td.to_numpy / compute
    with pytest.raises(ValueError, match=r"einsum 'ii': index 'i' is repeated in operand 0 \(shape \(1, 2\)\)"):
        td.einsum("ii", np.ones((1, 2)))  # numpy refuses it too; it was computed
    with pytest.raises(ValueError, match=r"transpose: axes \(\) are not a permutation of 0..0"):
        td.asarray(np.ones(3)).transpose(())  # was read as "reverse"
    assert td.to_numpy(td.asarray(np.array(2.0)).transpose(())) == 2.0


def test_relations_past_the_byte_limit_are_refused_when_written():
    """Plans count bytes exactly in int64: a relation over MAX_BYTES (64 PiB) is a
    clear error at construction — a source, and a product whose pairs would be —
    not an overflow in the cost model or a wrapped peak."""
    from tra_dask.logical.nodes import MAX_BYTES

    with pytest.raises(ValueError, match=r"a relation may hold at most 7.21e\+16 bytes"):
        td.from_function(lambda k: None, (10**9, 10**9), (10**9, 10**9), "float64", name="huge")
    col = td.from_function(lambda k: None, (4 * 10**9, 1), (4 * 10**8, 1), "float64", name="col")
    row = td.from_function(lambda k: None, (1, 4 * 10**9), (1, 4 * 10**8), "float64", name="row")
    assert col.nbytes < MAX_BYTES
    with pytest.raises(ValueError, match=r"join\(col, row\): 1.*elements of float64 .*a relation may hold at most"):
        td.join(col, row, [1], [0], "matmul")


def test_array_inputs_from_dask_are_checked_like_numpy_ones():
    """A dtype no kernel computes in or unknown chunk sizes: refused when the array
    is made, for dask inputs as for numpy ones; an empty axis and a complex dtype are
    accepted alike (issue 41: numpy's results; tests/test_complex_and_keywords.py)."""
    da = pytest.importorskip("dask.array")
    for x in (np.ones(0), da.ones(0, chunks=1), da.ones((2, 0), chunks=1)):
        assert 0 in td.from_array(x).shape and td.to_numpy(td.from_array(x)).shape == x.shape
    for x in (np.array([1 + 2j]), da.from_array(np.array([1 + 2j, 3j]), chunks=1)):
        assert td.from_array(x).dtype == np.complex128
    for x in (np.array(["x"]), da.from_array(np.array(["x", "y"]), chunks=1)):
        with pytest.raises(TypeError, match="dtype <U1 is not supported"):
            td.from_array(x)
    unknown = da.ones(6, chunks=2)
    unknown = unknown[unknown > 0]
    with pytest.raises(ValueError, match=r"unknown chunk sizes .*compute_chunk_sizes"):
        td.from_array(unknown)
    got = td.einsum("ij,jk->ik", da.ones((2, 0), chunks=1), da.ones((0, 3), chunks=1))
    np.testing.assert_array_equal(td.to_numpy(got), np.zeros((2, 3)))


def test_kernel_replace_and_a_dict_of_arrays():
    k1_ = td.kernel(lambda x: x + 1, name="replaced_twice", shape="same", replace=True)
    with pytest.raises(ValueError, match="pick another name or pass replace=True"):
        td.kernel(lambda x: x + 2, name="replaced_twice", shape="same")
    k2_ = td.kernel(lambda x: x + 2, name="replaced_twice", shape="same", replace=True)
    assert td.kernels.get_kernel("replaced_twice") is k2_ and k2_ != k1_
    x = td.from_array(np.ones(3))
    with pytest.raises(TypeError, match=r"a dict of outputs: item 'y' is a Array.*as a tuple of arrays"):
        td.evaluate({"y": x.sum()})


def test_a_kernel_other_kernels_laws_name_cannot_be_replaced():
    """row_sum distributes over add by name: replacing add would hand that law to
    another function (a max registered as "add" made the optimizer push row_sum
    below it: a wrong plan)."""
    with pytest.raises(ValueError, match=r"the kernel 'add' cannot be replaced: the distributive laws of .*row_sum"):
        td.kernel(lambda a, b: np.maximum(a, b), name="add", shape="broadcast", replace=True)
    assert td.kernels.get_kernel("add")(np.array([1.0]), np.array([2.0]))[0] == 3  # still the sum


@pytest.mark.timeout(120)
def test_describing_placements_of_a_shared_dag_visits_each_node_once():
    """A self-join of a self-join ... is a DAG of 40 nodes and 2**40 paths: describing
    (and explaining) its placement walks nodes, not paths."""
    x = td.from_numpy(np.ones((4, 4)), 2, name="X")
    for _ in range(40):
        x = td.join(x, x, [0, 1], [0, 1], "add")
    plan = td.compile(x, sites=2)
    assert plan.outputs[0].placement is not None and "join" in plan.explain().lower()


# -- extents: one check in every constructor (issue 39) -----------------------------

def _zeros_region(region):
    return np.zeros(tuple(s.stop - s.start for s in region))


def _constructors():
    from tra_dask.programs import UniformRegion, random_uniform, uniform_array

    return {
        "from_region": lambda s: td.from_region(_zeros_region, s, "float64"),
        "uniform_array": lambda s: uniform_array(s),
        "random_uniform": lambda s: random_uniform(s, 1),
        "from_function": lambda s: td.from_function(lambda k: None, s, 1, "float64"),
        "UniformRegion": lambda s: UniformRegion(s),
        # block sizes are extents too
        "einsum": lambda s: td.einsum("ij->ij", np.ones((2, 3)), chunks={"i": s[0], "j": s[1]}),
    }


_NOT_INT = r"extents must be ints >= 1 and < 2\*\*63"


@pytest.mark.parametrize("bad, err, msg", [
    (2.5, TypeError, r"extent 2\.5 \(float\) for dim 0; " + _NOT_INT),  # was int(2.5): a 2x3 array
    ("3", TypeError, r"extent '3' \(str\) for dim 0; " + _NOT_INT),  # was accepted
    (True, TypeError, r"extent True \(bool\) for dim 0; " + _NOT_INT),  # was a dim of 1
    (float("inf"), TypeError, r"extent inf \(float\) for dim 0; " + _NOT_INT),  # was an OverflowError
    (float("nan"), TypeError, r"extent nan \(float\) for dim 0; " + _NOT_INT),  # was int()'s ValueError, naming nothing
    (2**64, ValueError, r"extent 18446744073709551616 for dim 0, which does not fit in int64; every extent must be "
                        r"an int >= 1 and < 2\*\*63"),  # was accepted
    (None, TypeError, r"extent None \(NoneType\) for dim 0; " + _NOT_INT),
    (-1, ValueError, r"empty or negative dim \(extent -1 for dim 0\); every extent must be an int >= 1"),
    (0, ValueError, r"empty or negative dim \(extent 0 for dim 0\); every extent must be an int >= 1"),
])
@pytest.mark.parametrize("where", list(_constructors()))
def test_every_constructor_checks_its_extents(where, bad, err, msg):
    with pytest.raises(err, match=rf"^{where}\b.*: .*{msg}") as got:
        _constructors()[where]((bad, 3))
    assert type(got.value) is err  # not a subclass (OverflowError is an ArithmeticError, not a ValueError)


@pytest.mark.parametrize("where", list(_constructors()))
def test_constructors_take_python_and_numpy_ints(where):
    x = _constructors()[where]((np.int64(2), 3))
    assert x.shape == (2, 3) and all(type(n) is int for n in x.shape)


def test_extents_of_one_validator():
    from tra_dask.types import check_extents

    assert check_extents((np.int32(4), np.uint8(5), 6), "f") == (4, 5, 6)
    assert check_extents(7, "f") == (7,) and check_extents([1, 2], "f") == (1, 2) and check_extents((), "f") == ()
    assert check_extents(np.array([3, 4]), "f") == (3, 4)
    assert check_extents((2**63 - 1,), "f") == (2**63 - 1,)
    with pytest.raises(TypeError, match=r"f: shape must be a tuple of ints, got '12' \(str\)"):
        check_extents("12", "f")
    with pytest.raises(TypeError, match=r"extent np\.True_ \(bool\)"):
        check_extents((np.bool_(True),), "f")
    with pytest.raises(TypeError, match=r"extent np\.float64\(2\.0\) \(float64\)"):
        check_extents((np.float64(2.0),), "f")


def test_chunk_sizes_over_int64_are_refused():
    with pytest.raises(ValueError, match=r"from_numpy Z: chunk size 18446744073709551616 for dim 0 is over 2\*\*63 - 1"):
        td.from_numpy(np.ones((4, 6)), (2**64, 2), name="Z")
