"""The batched flood fill (``reachable_tensor``) against the seed's per-board BFS reference."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.env import floodfill
from rlperf.env.floodfill import PACKED_MAX_SIZE, reachable_bfs, reachable_tensor

STEPS = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])
SIZES = [4, 5, 10, 16, 70]  # 70 > PACKED_MAX_SIZE: the bool-dilation fallback
BOARDS = {4: 1500, 5: 1500, 10: 1500, 16: 500, 70: 30}  # per kind; BFS on 70x70 boards is slow


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Results do not depend on the thread count; one thread keeps this file's time steady on
    a busy shared runner, where each small parallel op can wait milliseconds for a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def density_boards(m: int, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Boards with cells blocked at random, each board at its own density in [0, 0.9].

    Half the starts are uniform (often blocked on dense boards), half on a free cell when
    the board has one.
    """
    density = torch.rand(m, 1, 1, generator=gen) * 0.9
    blocked = torch.rand(m, size, size, generator=gen) < density
    uniform = torch.randint(0, size * size, (m,), generator=gen)
    on_free = (torch.rand(m, size * size, generator=gen) + (~blocked).view(m, -1)).argmax(1)
    start = torch.where(torch.rand(m, generator=gen) < 0.5, uniform, on_free)
    return blocked, start


def snake_boards(m: int, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Boards blocked by a snake body: a random self-avoiding walk of 1 .. 2*S*S/3 cells.

    Starts: next to the head (free or body), a uniform cell, or the head itself (blocked).
    """
    max_length = 2 * size * size // 3
    blocked = torch.zeros(m, size, size, dtype=torch.bool)
    length = torch.randint(1, max_length + 1, (m,), generator=gen)
    head = torch.randint(0, size, (m, 2), generator=gen)
    boards = torch.arange(m)
    blocked[boards, head[:, 0], head[:, 1]] = True
    growing = torch.ones(m, dtype=torch.bool)
    for step in range(1, max_length):
        nxt = head.unsqueeze(1) + STEPS  # (m, 4, 2)
        inside = ((nxt >= 0) & (nxt < size)).all(2)
        nxt = nxt.clamp(0, size - 1)
        ok = inside & ~blocked[boards.unsqueeze(1), nxt[..., 0], nxt[..., 1]]
        growing &= ok.any(1) & (step < length)
        if not growing.any():
            break
        pick = torch.rand(m, 4, generator=gen).masked_fill(~ok, -1.0).argmax(1)
        head = torch.where(growing.unsqueeze(1), nxt[boards, pick], head)
        blocked[boards, head[:, 0], head[:, 1]] = True
    beside = (head + STEPS[torch.randint(0, 4, (m,), generator=gen)]).clamp(0, size - 1)
    kind = torch.randint(0, 3, (m,), generator=gen)
    start = torch.where(kind == 0, beside[:, 0] * size + beside[:, 1], head[:, 0] * size + head[:, 1])
    start = torch.where(kind == 1, torch.randint(0, size * size, (m,), generator=gen), start)
    return blocked, start


def all_forms(blocked: torch.Tensor, start: torch.Tensor, fixed_max_size: int = 31) -> dict[str, torch.Tensor]:
    """Every internal path of the fast form: the public entry, both array libraries of the
    packed rounds, with early exit and with the fixed schedule that CUDA runs (up to
    ``fixed_max_size``: S*S/2 rounds get slow), and the bool fallback where it is cheap."""
    size = blocked.shape[1]
    results = {"reachable_tensor": reachable_tensor(blocked, start)}
    if size <= PACKED_MAX_SIZE:
        for use_numpy in (False, True):
            for early_exit in (False, True) if size <= fixed_max_size else (True,):
                name = f"packed numpy={use_numpy} early_exit={early_exit}"
                results[name] = floodfill._reachable_packed(blocked, start, early_exit, use_numpy)
    if size <= 5:  # S*S - 1 rounds: too slow for bigger boards
        results["dilated fixed rounds"] = floodfill._reachable_dilated(blocked, start, early_exit=False)
    if size <= 10:
        results["dilated early exit"] = floodfill._reachable_dilated(blocked, start, early_exit=True)
    return results


def assert_all_forms_match_bfs(blocked: torch.Tensor, start: torch.Tensor) -> None:
    """Every form equals the BFS reference exactly, board by board."""
    expected = reachable_bfs(blocked, start)
    for name, got in all_forms(blocked, start).items():
        assert got.dtype == torch.int64 and got.shape == expected.shape, name
        bad = (got != expected).nonzero().flatten()
        assert bad.numel() == 0, (
            f"{name}: {bad.numel()} boards differ, first board {int(bad[0])}: "
            f"got {int(got[bad[0]])}, BFS {int(expected[bad[0]])}, start {int(start[bad[0]])}\n"
            f"{blocked[bad[0]].int()}")


@pytest.mark.parametrize("size", SIZES)
def test_matches_bfs_on_random_density_boards(size: int) -> None:
    blocked, start = density_boards(BOARDS[size], size, torch.Generator().manual_seed(1000 + size))
    start_blocked = blocked.flatten(1).gather(1, start[:, None]).squeeze(1)
    assert start_blocked.any() and not start_blocked.all(), "want both free and blocked starts"
    assert_all_forms_match_bfs(blocked, start)


@pytest.mark.parametrize("size", SIZES)
def test_matches_bfs_on_snake_boards(size: int) -> None:
    blocked, start = snake_boards(BOARDS[size], size, torch.Generator().manual_seed(2000 + size))
    assert_all_forms_match_bfs(blocked, start)


def test_bitstream_packer_through_the_whole_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small batches pack with the weighted sum; force the big-batch packer on every size."""
    monkeypatch.setattr(floodfill, "_BITSTREAM_MIN_CELLS", 0)
    gen = torch.Generator().manual_seed(3)
    for size in (1, 2, 3, 7, 10, 13, 15, 24, 25, 31, 47, 62):
        for m in (1, 7, 101):  # M * S * S not a multiple of 8 exercises the tail byte
            blocked, start = density_boards(m, size, gen)
            assert torch.equal(reachable_tensor(blocked, start), reachable_bfs(blocked, start)), (size, m)


@pytest.mark.parametrize("size", [1, 2, 3, 8, 9, 10, 14, 15, 24, 25, 30, 31, 40, 62])
def test_packers_agree_with_a_direct_sum(size: int) -> None:
    gen = torch.Generator().manual_seed(size)
    boards = torch.rand(37, size, size, generator=gen) < 0.5
    dtype = floodfill._row_dtype(size)
    for blocked in (boards, boards[1:], boards[5:20].transpose(1, 2)):  # unaligned, strided
        direct = sum(blocked[..., c].long() << c for c in range(size)).to(dtype)
        assert torch.equal(floodfill._pack_rows_weighted(blocked, dtype), direct)
        assert torch.equal(floodfill._pack_rows_bitstream(blocked, dtype), direct)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), size=st.integers(1, 9), m=st.integers(1, 5))
def test_matches_bfs_on_arbitrary_small_boards(data: st.DataObject, size: int, m: int) -> None:
    cells = data.draw(st.lists(st.booleans(), min_size=m * size * size, max_size=m * size * size))
    starts = data.draw(st.lists(st.integers(0, size * size - 1), min_size=m, max_size=m))
    blocked = torch.tensor(cells, dtype=torch.bool).view(m, size, size)
    start = torch.tensor(starts, dtype=torch.int64)
    expected = reachable_bfs(blocked, start)
    assert torch.equal(reachable_tensor(blocked, start), expected)
    assert torch.equal(floodfill._reachable_packed(blocked, start, early_exit=False), expected)


def test_matches_bfs_on_every_3x3_board_from_every_start() -> None:
    """Exhaustive where it is cheap: 512 boards x 9 starts, every form and schedule."""
    codes = torch.arange(1 << 9)
    boards = ((codes.unsqueeze(1) >> torch.arange(9)) & 1).bool().view(-1, 3, 3)
    blocked = boards.repeat_interleave(9, 0)
    start = torch.arange(9).repeat(boards.shape[0])
    assert_all_forms_match_bfs(blocked, start)


# --- hand-built boards ---------------------------------------------------------------------


def spiral(size: int) -> tuple[torch.Tensor, int]:
    """A width-1 corridor spiralling in from the corner, walls between its turns; its length."""
    free = torch.zeros(size, size, dtype=torch.bool)
    row = col = 0
    free[0, 0] = True
    lengths = [size - 1] * 3 + [n for k in range(size - 3, 0, -2) for n in (k, k)]
    for turn, length in enumerate(lengths):
        d_row, d_col = ((0, 1), (1, 0), (0, -1), (-1, 0))[turn % 4]
        for _ in range(length):
            row, col = row + d_row, col + d_col
            free[row, col] = True
    return ~free, int(free.sum())


def staircase(size: int) -> torch.Tensor:
    """Free cells (r, r) and (r, r + 1) only: a turn at every cell, about S rounds of fill."""
    blocked = torch.ones(size, size, dtype=torch.bool)
    index = torch.arange(size)
    blocked[index, index] = False
    blocked[index[:-1], index[:-1] + 1] = False
    return blocked


@pytest.mark.parametrize("size", [1, 2, 5, 10, 14, 15, 31, 62, 63, 70])
def test_fully_free_board_reaches_every_cell(size: int) -> None:
    blocked = torch.zeros(3, size, size, dtype=torch.bool)
    start = torch.tensor([0, size * size - 1, (size * size) // 2])
    for name, got in all_forms(blocked, start).items():
        assert got.tolist() == [size * size] * 3, name


@pytest.mark.parametrize("size", [3, 10, 70])
def test_isolated_cell_and_blocked_start(size: int) -> None:
    blocked = torch.zeros(2, size, size, dtype=torch.bool)
    blocked[0, 0, 1] = blocked[0, 1, 0] = blocked[0, 2, 1] = blocked[0, 1, 2] = True  # box (1, 1) in
    blocked[1, 2, 2] = True
    start = torch.tensor([size + 1, 2 * size + 2])
    for name, got in all_forms(blocked, start).items():
        assert got.tolist() == [1, 0], name


@pytest.mark.parametrize("size", [5, 10, 62, 70])
def test_wall_splits_the_board(size: int) -> None:
    wall = size // 2
    blocked = torch.zeros(4, size, size, dtype=torch.bool)
    blocked[:2, :, wall] = True  # a column wall
    blocked[2:, wall, :] = True  # a row wall
    last = size * size - 1
    start = torch.tensor([0, last, 0, last])
    near, far = wall * size, (size - wall - 1) * size
    for name, got in all_forms(blocked, start).items():
        assert got.tolist() == [near, far, near, far], name


@pytest.mark.parametrize("size", [5, 6, 10, 16, 33, 62])
def test_spiral_corridor(size: int) -> None:
    board, length = spiral(size)
    blocked = board.expand(2, size, size).contiguous()
    start = torch.tensor([0, int((~board).flatten().nonzero()[-1])])  # either end
    for name, got in all_forms(blocked, start).items():
        assert got.tolist() == [length, length], name


@pytest.mark.parametrize("size", [4, 10, 14, 15, 30, 31, 62])
def test_staircase_needs_a_round_per_turn(size: int) -> None:
    """The reach grows by one step of the stair per round, so stopping a round early, or the
    fixed CUDA schedule running too few rounds, misses cells."""
    blocked = staircase(size).expand(2, size, size).contiguous()
    start = torch.tensor([0, size * size - 1])
    for name, got in all_forms(blocked, start, fixed_max_size=PACKED_MAX_SIZE).items():
        assert got.tolist() == [2 * size - 1] * 2, name


def test_row_fill_runs_both_ways_from_mid_run() -> None:
    size = 10
    blocked = torch.ones(2, size, size, dtype=torch.bool)
    blocked[0, 4, 1:9] = False  # one row run, cells 1..8
    blocked[1, 1:9, 4] = False  # one column run
    start = torch.tensor([4 * size + 5, 5 * size + 4])
    for name, got in all_forms(blocked, start).items():
        assert got.tolist() == [8, 8], name


def test_empty_batch_and_result_type() -> None:
    empty = reachable_tensor(torch.zeros(0, 10, 10, dtype=torch.bool), torch.zeros(0, dtype=torch.int64))
    assert empty.shape == (0,) and empty.dtype == torch.int64
    got = reachable_tensor(torch.zeros(2, 4, 4, dtype=torch.bool), torch.tensor([0, 5]))
    assert got.dtype == torch.int64 and got.device == torch.device("cpu")


@pytest.mark.parametrize(("blocked", "start"), [
    (torch.zeros(2, 4, 4), torch.zeros(2, dtype=torch.int64)),  # float boards
    (torch.zeros(2, 4, 5, dtype=torch.bool), torch.zeros(2, dtype=torch.int64)),  # not square
    (torch.zeros(2, 4, 4, dtype=torch.bool), torch.zeros(2, dtype=torch.int32)),  # int32 starts
    (torch.zeros(2, 4, 4, dtype=torch.bool), torch.zeros(3, dtype=torch.int64)),  # M mismatch
])
def test_rejects_malformed_inputs(blocked: torch.Tensor, start: torch.Tensor) -> None:
    with pytest.raises(ValueError):
        reachable_tensor(blocked, start)


def test_rounds_bound_counts_row_runs() -> None:
    # S=1: one run, no round needed; S=3: at most 2 runs a row, 6 runs, 5 rounds after the first.
    assert floodfill.packed_rounds_bound(1) == 0
    assert floodfill.packed_rounds_bound(3) == 5
    assert floodfill.packed_rounds_bound(10) == 49


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("size", [5, 10, 16, 40, 70])
def test_cuda_matches_bfs_without_host_sync(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(4000 + size)
    m = 40 if size > PACKED_MAX_SIZE else 600
    snake_blocked, snake_start = snake_boards(m, size, gen)
    dense_blocked, dense_start = density_boards(m, size, gen)
    spiral_board, _ = spiral(size)
    blocked = torch.cat([snake_blocked, dense_blocked, spiral_board[None], staircase(size)[None]])
    start = torch.cat([snake_start, dense_start, torch.tensor([0, 0])])
    expected = reachable_bfs(blocked, start)
    blocked_cuda, start_cuda = blocked.cuda(), start.cuda()
    for bitstream_min in (1 << 40, 0):  # both packers
        monkeypatch.setattr(floodfill, "_BITSTREAM_MIN_CELLS", bitstream_min)
        reachable_tensor(blocked_cuda, start_cuda)  # warm-up: lazy CUDA init may sync
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = reachable_tensor(blocked_cuda, start_cuda)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert got.device == blocked_cuda.device
        assert torch.equal(got.cpu(), expected)
