"""The ``fused`` Snake kernel: one compiled per-board step for every board, written in place.

The ``ops`` kernel (:mod:`rlperf.env.vector`) spends a step on ~150 tensor operators, each paying
the dispatcher's fixed cost; at a few hundred boards that cost is nearly the whole step. This
module does the same step as plain scalar code per board -- turn, move, collide, eat, respawn the
fruit, win, hunger, same-step reset, episode statistics, the ``features`` or ``grid`` observation
and the flood-fill fractions -- compiled by numba (LLVM ships in its wheels: no C compiler at
install or run time; ``cache=True`` keeps the machine code on disk, so only the first process
compiles) and runs it for all boards in one call, in parallel over chunks of boards.

Memory. The kernel writes into VectorSnake's preallocated tensors through zero-copy numpy views
(``Tensor.numpy()`` shares the storage), so a step allocates nothing and never waits on a device.
The layout both kernels share (see ``VectorSnake._allocate_state``):

- ``state``  int64 ``(STATE_ROWS, N)``: one row per per-board counter (the ``*_ROW`` constants);
- ``ring``   int64 ``(N, C)``: the body's cells as a ring, the head at ``state[PTR_ROW]``;
- ``occ``    bool ``(N, C + 1)``: occupancy, with an always-occupied last column for the wall;
- ``floats`` float32 ``(FLOAT_ROWS, N)``: return so far, final return, this step's reward;
- ``flags``  bool ``(FLAG_ROWS, N)``: terminated, truncated, done;
- ``obs``    float32 ``(3, N, F)``: the two alternating observation buffers (slots 0 and 2) with
  ``final_obs`` between them (``grid`` observations are passed flattened, ``F = 3 * C``);
- ``table``  int64 ``(C + 1, TABLE_COLUMNS)``: each cell's neighbours (``C``, the wall, off the
  board), row and column; ``scratch`` uint64: the flood fill's row masks, one set per chunk.

Random draws. Each step has three uniform draws in [0, 1) per board (the ``*_DRAW`` rows): the
fruit cell after eating, the start of a new episode, and the fruit cell after that start. A draw
``u`` picks the ``floor(u * m)``-th of the ``m`` candidates in a fixed order (free cells in
row-major order; starts by heading, then position), in float64, exactly as the ``ops`` kernel
does. By default the kernel computes a draw only when a board needs it, from a counter-based hash
of (seed key, board index, step counter, row), so board i's stream does not depend on N;
``VectorSnake.step_with_draws`` passes explicit draws instead, which is how the tests feed both
kernels the same ones and compare every field bit for bit.

Flood fill. Per board, on row bitmasks (one uint64 per row, so boards up to 64 wide): sweeps down
and up the rows let reached cells into the free cells above and below and then along their row
run, until a sweep changes nothing. The moves that do not eat share one blocked set (the body less
its tail), so one fill usually answers all of them; the eating move, at most one, fills again with
the tail kept. ``tests/test_fused_kernel.py`` checks it against the BFS reference.

Compilation. The board functions never allocate, so they are compiled without numba's reference
counting (``_nrt=False``, as numba compiles its own sort and string helpers); the hot, small ones
are inlined into the per-chunk loop, the rare or large ones (reset, fruit, flood fill) are calls.
A cold compile takes seconds to tens of seconds (BENCHMARKS.md); later processes load the cache.

On the CPU, ``step_boards`` gives each thread chunks of ``CHUNK`` boards and one scratch set per
chunk. The board functions (``BOARD_FUNCTIONS``) are scalar code (no allocation, no Python objects,
only loops, integer arithmetic and indexing into whole arrays); :mod:`rlperf.env.fused_cuda`
compiles the same source as CUDA device functions, one thread per board.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

try:  # numba is a core dependency; VectorSnake reports why it falls back to ``ops`` if this fails
    import numba
    from numba import njit, prange
except Exception as exc:
    numba = None  # type: ignore[assignment]
    prange = range  # type: ignore[misc]
    IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    IMPORT_ERROR = None

# Per-board counters, rows of ``state``. The final counters are the last rows: what a step returns
# of ``state``, ``floats`` and ``flags`` is then one run of bytes (``VectorSnake._allocate_state``).
PTR_ROW, LENGTH_ROW, HEAD_ROW, DIR_ROW, FRUIT_ROW, HUNGRY_ROW = 0, 1, 2, 3, 4, 5
EP_LEN_ROW, EP_SCORE_ROW, FINAL_LEN_ROW, FINAL_SCORE_ROW = 6, 7, 8, 9
STATE_ROWS = 10
# Rows of ``floats`` and ``flags``.
EP_RETURN_ROW, FINAL_RETURN_ROW, REWARD_ROW = 0, 1, 2
FLOAT_ROWS = 3
TERMINATED_ROW, TRUNCATED_ROW, DONE_ROW = 0, 1, 2
FLAG_ROWS = 3
# Rows of the per-step draws.
FRUIT_DRAW, START_DRAW, RESET_FRUIT_DRAW = 0, 1, 2
DRAW_ROWS = 3
# Slot of final_obs in the (3, N, F) observation array, between the two alternating buffers (0 and
# 2), so each returned observation and final_obs are one contiguous block to copy.
FINAL_OBS = 1
OBS_SLOTS = (0, 2)

# Columns of the per-cell table: the neighbour in each heading (the wall ``C`` off the board),
# then the cell's row and column.
ROW_COLUMN, COL_COLUMN, TABLE_COLUMNS = 4, 5, 6
# Relative action -> change of heading (straight, right, left); heading -> (row, col) step.
TURNS = (0, 1, 3)
DELTA_ROW = (-1, 0, 1, 0)
DELTA_COL = (0, 1, 0, -1)
N_FEATURES = 11

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BOARD_MUL = np.uint64(0x9E3779B97F4A7C15)
_STEP_MUL = np.uint64(0xD6E8FEB86659FD93)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53

# Boards per chunk on the CPU: a chunk is the unit a thread takes and owns one scratch row.
CHUNK = 64
# Below this many boards the step runs on the calling thread: waking the pool costs more.
SERIAL_MAX = 512
SERIAL_MAX_FLOOD = 64
# The flood fill's row bitmasks hold one row in a uint64.
MAX_SIZE = 64


# The board code never allocates, so it is compiled without numba's reference counting (``_nrt``,
# as numba compiles its own sort and string helpers): with it, every array passed to a compiled
# call, and every array variable an inlined body introduces, costs atomic increments and
# decrements -- as much as the rest of a board's step, and contended between threads.


def _jit(fn):
    """Hot and small: inlined into the caller at numba's IR level."""
    return njit(cache=True, inline="always", _nrt=False)(fn) if numba is not None else fn  # type: ignore[call-overload]


def _call(fn):
    """Rare or large (resets, fruit, flood fill): a plain call, so each is compiled once."""
    return njit(cache=True, _nrt=False)(fn) if numba is not None else fn  # type: ignore[call-overload]


# ------------------------------------------------------------------------------------------------
# Random draws


def mix64(z):
    """splitmix64's finalizer: a bijection of uint64 that scrambles every bit."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


mix64 = _jit(mix64)


def uniform(key, board, counter, row):
    """The default draw: a float64 in [0, 1) from (seed key, board index, step counter, row)."""
    h = mix64(key ^ (np.uint64(board) * _BOARD_MUL))
    h = mix64(h ^ (np.uint64(counter * DRAW_ROWS + row) * _STEP_MUL))
    return np.float64(h >> _S11) * _TO_UNIT


uniform = _jit(uniform)


def draw(draws, injected, key, counter, i, row):
    """Draw ``row`` of board ``i`` this step: the injected one, or the counter-based stream's."""
    if injected:
        return draws[row, i]
    return uniform(key, i, counter, row)


draw = _jit(draw)


def pick(u, m):
    """Index of the candidate a draw ``u`` picks among ``m``: ``floor(u * m)``, at most ``m - 1``."""
    k = np.int64(u * m)
    return k if k < m else m - 1


pick = _jit(pick)


# ------------------------------------------------------------------------------------------------
# One board


def tail_cell(ring, state, i, cells):
    at = state[PTR_ROW, i] - state[LENGTH_ROW, i] + 1
    if at < 0:
        at += cells
    return ring[i, at]


tail_cell = _jit(tail_cell)


def place_fruit(i, occ, state, cells, u):
    """Fruit on the ``pick(u, free)``-th free cell of board ``i``, in row-major order."""
    k = pick(u, cells - state[LENGTH_ROW, i])
    for cell in range(cells):
        if not occ[i, cell]:
            if k == 0:
                state[FRUIT_ROW, i] = cell
                return
            k -= 1


place_fruit = _call(place_fruit)


def start_episode(i, occ, ring, state, floats, size, initial_length, u):
    """A straight snake of ``initial_length`` at the start a draw ``u`` picks; counters to 0.

    The starts are ordered by heading, then by the head's distance ``along`` the heading from the
    wall it faces away from (room for the body behind it), then by its position ``across``.
    """
    cells = size * size
    span = size - initial_length + 1
    per_heading = span * size
    j = pick(u, 4 * per_heading)
    heading = j // per_heading
    along = (j % per_heading) // size
    across = j % size
    if heading == 0:
        row, col = along, across
    elif heading == 1:
        row, col = across, size - 1 - along
    elif heading == 2:
        row, col = size - 1 - along, across
    else:
        row, col = across, along
    for cell in range(cells):
        occ[i, cell] = False
    occ[i, cells] = True
    for k in range(initial_length):
        cell = (row - k * DELTA_ROW[heading]) * size + col - k * DELTA_COL[heading]
        occ[i, cell] = True
        ring[i, initial_length - 1 - k] = cell  # tail first, head last
    state[PTR_ROW, i] = initial_length - 1
    state[LENGTH_ROW, i] = initial_length
    state[HEAD_ROW, i] = row * size + col
    state[DIR_ROW, i] = heading
    state[HUNGRY_ROW, i] = 0
    state[EP_LEN_ROW, i] = 0
    state[EP_SCORE_ROW, i] = 0
    floats[EP_RETURN_ROW, i] = 0.0


start_episode = _call(start_episode)


# The flood fill works on row bitmasks (one uint64 per row, bit ``col``), so a board is at most
# 64 cells wide. A fill sweeps the rows down and up, letting reached cells into the free cells
# above and below and then along their row run, until a sweep changes nothing: the number of
# sweeps is about the number of turns on the way, not the path length.

_ONE = np.uint64(1)
_FIVES, _THREES, _NIBBLES = np.uint64(0x5555555555555555), np.uint64(0x3333333333333333), np.uint64(0x0F0F0F0F0F0F0F0F)
_BYTES, _S1, _S2, _S4, _S56 = np.uint64(0x0101010101010101), np.uint64(1), np.uint64(2), np.uint64(4), np.uint64(56)
FREE, FILLS = 0, 1  # scratch rows: the free-cell masks, then one set of reached masks per fill
SCRATCH_SETS = 4


def popcount(x):
    x = x - ((x >> _S1) & _FIVES)
    x = (x & _THREES) + ((x >> _S2) & _THREES)
    x = (x + (x >> _S4)) & _NIBBLES
    return np.int64((x * _BYTES) >> _S56)


popcount = _jit(popcount)


def smear(x, free):
    """``x`` grown along its row through free cells: the whole free runs that hold a bit of ``x``."""
    while True:
        y = (x | (x << _S1) | (x >> _S1)) & free
        if y == x:
            return x
        x = y


smear = _jit(smear)


def fill_rows(scratch, chunk, fill, size, start):
    """Count the cells reachable from the free cell ``start`` through the free-cell row masks
    ``scratch[chunk, FREE]``, leaving them in ``scratch[chunk, fill]``.

    Sweeps alternate down and up; in each, a row takes the reached cells of the row before it that
    are free in its own row, then grows them along its free runs (``smear``). Starting with
    ``changed`` and the start's own row untouched, the first sweep grows the start's run too.
    """
    for row in range(size):
        scratch[chunk, fill, row] = 0
    row0 = start // size
    scratch[chunk, fill, row0] = _ONE << np.uint64(start - row0 * size)
    sweeps_unchanged = 0
    down = True
    while sweeps_unchanged < 2:
        changed = False
        for k in range(size):
            row = k if down else size - 1 - k
            reached = scratch[chunk, fill, row]
            enter = reached
            if k > 0:
                enter |= scratch[chunk, fill, row - 1 if down else row + 1]
            free = scratch[chunk, FREE, row]
            grown = smear(enter & free, free)
            if grown != reached:
                scratch[chunk, fill, row] = grown
                changed = True
        sweeps_unchanged = 0 if changed else sweeps_unchanged + 1
        down = not down
    count = 0
    for row in range(size):
        count += popcount(scratch[chunk, fill, row])
    return count


fill_rows = _call(fill_rows)


def reached_by(scratch, chunk, fill, size, cell):
    row = cell // size
    return (scratch[chunk, fill, row] >> np.uint64(cell - row * size)) & _ONE


reached_by = _jit(reached_by)


def flood_features(i, obs, slot, occ, ring, state, table, size, scratch, chunk):
    """``obs[slot, i, 11:14]``: share of the free cells reachable after each relative move, 0 if deadly.

    Reads the danger flags already in ``obs[slot, i, 0:3]``. The moves that do not eat free the
    tail and share one blocked set: a target already reached by an earlier fill takes that fill's
    count. The eating move (at most one) keeps the tail and fills last, on its own.
    """
    cells = size * size
    head = state[HEAD_ROW, i]
    heading = state[DIR_ROW, i]
    fruit = state[FRUIT_ROW, i]
    length = state[LENGTH_ROW, i]
    tail = tail_cell(ring, state, i, cells)
    for row in range(size):
        bits = np.uint64(0)
        base = row * size
        for col in range(size):
            if not occ[i, base + col]:
                bits |= _ONE << np.uint64(col)
        scratch[chunk, FREE, row] = bits
    tail_row = tail // size
    tail_bit = _ONE << np.uint64(tail - tail_row * size)
    scratch[chunk, FREE, tail_row] |= tail_bit
    fills = 0
    count1 = count2 = 0
    eat_move = -1
    for task in range(4):  # the three moves, then the eating move if there is one
        if task < 3:
            move = task
            obs[slot, i, N_FEATURES + move] = 0.0
            if obs[slot, i, move] != 0.0:
                continue
            target = table[head, (heading + TURNS[move]) & 3]
            if target == fruit:
                eat_move = move
                continue
            if fills >= 1 and reached_by(scratch, chunk, FILLS, size, target):
                obs[slot, i, N_FEATURES + move] = np.float32(count1) / np.float32(cells - length + 1)
                continue
            if fills >= 2 and reached_by(scratch, chunk, FILLS + 1, size, target):
                obs[slot, i, N_FEATURES + move] = np.float32(count2) / np.float32(cells - length + 1)
                continue
            into = FILLS + fills
            free = cells - length + 1  # the tail's cell is free
        else:
            if eat_move < 0:
                break
            move, target, into = eat_move, fruit, FILLS + 2
            scratch[chunk, FREE, tail_row] &= ~tail_bit
            free = cells - length
        count = fill_rows(scratch, chunk, into, size, target)
        if task < 3:
            if fills == 0:
                count1 = count
            else:
                count2 = count
            fills += 1
        obs[slot, i, N_FEATURES + move] = np.float32(count) / np.float32(max(free, 1))


flood_features = _call(flood_features)


def observe(i, obs, slot, occ, ring, state, table, size, grid, flood, scratch, chunk):
    """Board ``i``'s observation into ``obs[slot, i]``: ``grid`` planes or the feature vector."""
    cells = size * size
    head = state[HEAD_ROW, i]
    fruit = state[FRUIT_ROW, i]
    if grid:
        for cell in range(cells):
            obs[slot, i, cell] = occ[i, cell]
            obs[slot, i, cells + cell] = 0.0
            obs[slot, i, 2 * cells + cell] = 0.0
        obs[slot, i, cells + head] = 1.0
        if state[LENGTH_ROW, i] != cells:  # a full board has no fruit
            obs[slot, i, 2 * cells + fruit] = 1.0
        return
    heading = state[DIR_ROW, i]
    tail = tail_cell(ring, state, i, cells)
    for move in range(3):  # danger: the wall column and every segment but the tail
        target = table[head, (heading + TURNS[move]) & 3]
        obs[slot, i, move] = occ[i, target] and target != tail
    for direction in range(4):
        obs[slot, i, 3 + direction] = direction == heading
    # A full board parks its fruit under the head, so these are all 0 there.
    head_row, head_col = table[head, ROW_COLUMN], table[head, COL_COLUMN]
    fruit_row, fruit_col = table[fruit, ROW_COLUMN], table[fruit, COL_COLUMN]
    obs[slot, i, 7] = fruit_col < head_col
    obs[slot, i, 8] = fruit_col > head_col
    obs[slot, i, 9] = fruit_row < head_row
    obs[slot, i, 10] = fruit_row > head_row
    if flood:
        # np.int64: the final observation's slot is a literal, and a literal argument would compile a
        # second copy of the fill.
        flood_features(i, obs, np.int64(slot), occ, ring, state, table, size, scratch, chunk)


observe = _jit(observe)


def step_board(i, action, reset_only, draws, injected, key, counter, out, occ, ring, state, floats, flags, obs,
               table, scratch, chunk, size, initial_length, hunger, grid, flood):
    """Board ``i`` moves by ``action`` (0 straight, 1 right, 2 left); see VectorSnake for the rules.

    Writes the post-step observation to ``obs[FINAL_OBS, i]`` and the observation to return to
    ``obs[out, i]``: the same, or the first of a new episode if this one ended (same-step reset).
    With ``reset_only`` the board just starts a new episode, observed into ``obs[out, i]``.
    """
    cells = size * size
    done = True
    if not reset_only:
        heading = (state[DIR_ROW, i] + TURNS[action]) & 3
        target = table[state[HEAD_ROW, i], heading]
        tail = tail_cell(ring, state, i, cells)
        dead = occ[i, target] and target != tail  # the tail leaves this step, so its cell is free
        eat = target == state[FRUIT_ROW, i]
        if not dead:  # a dead board stays as it was: its final observation shows where it died
            if not eat:
                occ[i, tail] = False
            occ[i, target] = True
            ptr = state[PTR_ROW, i] + 1
            if ptr == cells:
                ptr = 0
            ring[i, ptr] = target
            state[PTR_ROW, i] = ptr
            state[HEAD_ROW, i] = target
            state[DIR_ROW, i] = heading
        length = state[LENGTH_ROW, i] + eat
        state[LENGTH_ROW, i] = length
        hungry = 0 if eat else state[HUNGRY_ROW, i] + 1
        state[HUNGRY_ROW, i] = hungry
        score = state[EP_SCORE_ROW, i] + eat
        state[EP_SCORE_ROW, i] = score
        reward = np.float32(eat) - np.float32(dead)
        win = eat and length == cells
        terminated = dead or win
        truncated = not terminated and hungry >= hunger
        done = terminated or truncated
        steps = state[EP_LEN_ROW, i] + 1
        state[EP_LEN_ROW, i] = steps
        returns = floats[EP_RETURN_ROW, i] + reward
        floats[EP_RETURN_ROW, i] = returns
        floats[REWARD_ROW, i] = reward
        flags[TERMINATED_ROW, i] = terminated
        flags[TRUNCATED_ROW, i] = truncated
        flags[DONE_ROW, i] = done
        state[FINAL_SCORE_ROW, i] = score
        state[FINAL_LEN_ROW, i] = steps
        floats[FINAL_RETURN_ROW, i] = returns
        if eat and not win:
            place_fruit(i, occ, state, cells, draw(draws, injected, key, counter, i, FRUIT_DRAW))
    if not reset_only:
        observe(i, obs, np.int64(FINAL_OBS), occ, ring, state, table, size, grid, flood, scratch, chunk)
        if not done:
            for k in range(obs.shape[2]):
                obs[out, i, k] = obs[FINAL_OBS, i, k]
            return
    start_episode(i, occ, ring, state, floats, size, initial_length, draw(draws, injected, key, counter, i, START_DRAW))
    place_fruit(i, occ, state, cells, draw(draws, injected, key, counter, i, RESET_FRUIT_DRAW))
    observe(i, obs, out, occ, ring, state, table, size, grid, flood, scratch, chunk)


step_board = _call(step_board)


# The per-board source both builds compile (callees before callers); the CPU driver is below.
BOARD_FUNCTIONS = ("mix64", "uniform", "draw", "pick", "tail_cell", "place_fruit", "start_episode", "popcount",
                   "smear", "fill_rows", "reached_by", "flood_features", "observe", "step_board")


# ------------------------------------------------------------------------------------------------
# All boards (the CPU driver)


def cell_table(size: int) -> np.ndarray:
    """The per-cell table ``(C + 1, TABLE_COLUMNS)``: neighbours by heading (``C``, the wall, off the
    board; the wall's own row is all wall), row, column."""
    cells = size * size
    table = np.full((cells + 1, TABLE_COLUMNS), cells, dtype=np.int64)
    for cell in range(cells):
        row, col = divmod(cell, size)
        for heading in range(4):
            r, c = row + DELTA_ROW[heading], col + DELTA_COL[heading]
            if 0 <= r < size and 0 <= c < size:
                table[cell, heading] = r * size + c
        table[cell, ROW_COLUMN], table[cell, COL_COLUMN] = row, col
    return table


def scratch(num_envs: int, size: int) -> np.ndarray:
    """The flood fill's scratch: for each chunk of boards, the free-cell masks and one set per fill."""
    return np.zeros(((num_envs + CHUNK - 1) // CHUNK, SCRATCH_SETS, size), dtype=np.uint64)


def first_bad_action(actions):
    """1 + the index of the first action outside {0, 1, 2}, or 0 if all are valid."""
    for i in range(actions.shape[0]):
        a = actions[i]
        if a < 0 or a > 2:
            return i + 1
    return 0


first_bad_action = _jit(first_bad_action)


def run_chunk(chunk, actions, draws, injected, key, counter, reset_all, out, occ, ring, state, floats, flags, obs,
              table, scratch, size, initial_length, hunger, grid, flood):
    stop = min(state.shape[1], (chunk + 1) * CHUNK)
    for i in range(chunk * CHUNK, stop):
        step_board(i, 0 if reset_all else actions[i], reset_all, draws, injected, key, counter, out, occ, ring, state,
                   floats, flags, obs, table, scratch, chunk, size, initial_length, hunger, grid, flood)


# A plain call per chunk of boards: the driver's serial and parallel loops share one compiled copy.
run_chunk = njit(cache=True, nogil=True, _nrt=False)(run_chunk) if numba is not None else run_chunk  # type: ignore[call-overload]


def step_boards(actions, draws, injected, key, counter, reset_all, out, occ, ring, state, floats, flags, obs, table,
                scratch, size, initial_length, hunger, grid, flood):
    """Step every board (or, with ``reset_all``, start a new episode on every board), on the calling thread.

    Returns 0, or 1 + the index of the first invalid action (then nothing was changed).
    """
    if not reset_all:
        bad = first_bad_action(actions)
        if bad:
            return bad
    for chunk in range((state.shape[1] + CHUNK - 1) // CHUNK):
        run_chunk(chunk, actions, draws, injected, key, counter, reset_all, out, occ, ring, state, floats, flags, obs,
                  table, scratch, size, initial_length, hunger, grid, flood)
    return 0


def step_boards_parallel(actions, draws, injected, key, counter, reset_all, out, occ, ring, state, floats, flags, obs,
                         table, scratch, size, initial_length, hunger, grid, flood):
    """:func:`step_boards` with the chunks shared among numba's threads."""
    if not reset_all:
        bad = first_bad_action(actions)
        if bad:
            return bad
    for chunk in prange((state.shape[1] + CHUNK - 1) // CHUNK):
        # np.int64: prange's index is unsigned, the serial loop's signed; one type, one compiled run_chunk.
        run_chunk(np.int64(chunk), actions, draws, injected, key, counter, reset_all, out, occ, ring, state, floats,
                  flags, obs, table, scratch, size, initial_length, hunger, grid, flood)
    return 0


if numba is not None:
    step_boards = njit(cache=True, nogil=True)(step_boards)
    # Compiled on first use only (parfors add seconds to a cold compile): a run on one thread, or with
    # few boards, never calls it (``VectorSnake`` picks the driver, :func:`compile_parallel`).
    step_boards_parallel = njit(cache=True, parallel=True, nogil=True)(step_boards_parallel)


def parallel_pays(num_envs: int, flood: bool, threads: int) -> bool:
    """Whether stepping ``num_envs`` boards on ``threads`` threads should share the chunks among them:
    below ``SERIAL_MAX`` boards (``SERIAL_MAX_FLOOD`` with the flood fill) waking the pool costs more."""
    return threads > 1 and num_envs > (SERIAL_MAX_FLOOD if flood else SERIAL_MAX)


def counter_draws(key: int, counter: int, num_envs: int) -> np.ndarray:
    """The default stream's draws of one step, materialised as a ``(DRAW_ROWS, num_envs)`` array.

    For tests: stepping with these injected must equal stepping with the stream itself.
    """
    k = np.uint64(key)
    return np.array([[uniform(k, i, counter, row) for i in range(num_envs)] for row in range(DRAW_ROWS)])


def seed_key(seed: int) -> np.uint64:
    """The stream key for ``reset(seed=...)``: any Python int, folded to 64 bits and mixed."""
    return np.uint64(mix64(np.uint64(int(seed) % 2**64)))


def available() -> str | None:
    """None if the fused kernel can run here, else why not (one line)."""
    if IMPORT_ERROR is not None:
        return f"numba cannot be imported ({IMPORT_ERROR})"
    if os.environ.get("NUMBA_DISABLE_JIT") == "1":
        return "NUMBA_DISABLE_JIT=1 is set (the kernel would run as plain Python)"
    return None


_compiled: dict[str, object] = {}


@contextlib.contextmanager
def compile_notice(what: str) -> Iterator[None]:
    """Say on stderr what numba compiles in the block and how long it took, one line, only when it
    compiles (the first run after install, or after a change of numba or of the source: later runs
    load the machine code from numba's disk cache). On a terminal the line starts when the compile
    does, so a wait of seconds is explained while it lasts; elsewhere it is written once, at the end."""
    started: list[float] = []
    terminal = sys.stderr.isatty()
    note = "numba, once: later runs load it from its cache"

    class Started(numba.core.event.Listener):
        def on_start(self, event: Any) -> None:  # numba compiles (a cache load fires no event)
            if not started:
                started.append(time.perf_counter())
                if terminal:
                    print(f"rlperf: compiling {what} ({note})…", end="", file=sys.stderr, flush=True)

        def on_end(self, event: Any) -> None:
            pass

    failed = True
    try:
        with numba.core.event.install_listener("numba:compile", Started()):
            yield
        failed = False
    finally:
        if started:
            took = f"{time.perf_counter() - started[0]:.1f} s" + (" (failed)" if failed else "")
            print(f" {took}" if terminal else f"rlperf: compiled {what} in {took} ({note})", file=sys.stderr,
                  flush=True)


def compile_kernel(parallel: bool = False) -> tuple[float, str | None]:
    """Compile the step for the argument types VectorSnake passes, or load it from numba's disk cache:
    the serial driver (:func:`step_boards`), or with ``parallel`` the threaded one
    (:func:`step_boards_parallel`), which a run compiles only when it steps that way (:func:`parallel_pays`).

    Once per process and driver; returns (seconds it took, None) or (seconds, the error in one line).
    A tiny board is enough: numba specialises on types, not sizes.
    """
    name = "parallel" if parallel else "serial"
    if name in _compiled:
        return _compiled[name]  # type: ignore[return-value]
    why = available()
    if why is not None:
        _compiled[name] = (0.0, why)
        return _compiled[name]  # type: ignore[return-value]
    started = time.perf_counter()
    driver = step_boards_parallel if parallel else step_boards
    try:
        size, cells = 4, 16
        table = cell_table(size)
        occ = np.zeros((1, cells + 1), dtype=np.bool_)
        ring = np.zeros((1, cells), dtype=np.int64)
        state = np.zeros((STATE_ROWS, 1), dtype=np.int64)
        floats = np.zeros((FLOAT_ROWS, 1), dtype=np.float32)
        flags = np.zeros((FLAG_ROWS, 1), dtype=np.bool_)
        obs = np.zeros((3, 1, N_FEATURES + 3), dtype=np.float32)
        draws = np.zeros((DRAW_ROWS, 1), dtype=np.float64)
        actions = np.zeros(1, dtype=np.int64)
        with compile_notice("the env step kernel" + (" (threaded driver)" if parallel else "")):
            for reset_all in (True, False):
                driver(actions, draws, True, np.uint64(0), 0, reset_all, 0, occ, ring, state, floats, flags, obs,
                       table, scratch(1, size), size, 1, 10, False, True)
        result: tuple[float, str | None] = (time.perf_counter() - started, None)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        result = (time.perf_counter() - started, f"numba failed to compile the kernel ({type(exc).__name__}: {first})")
    _compiled[name] = result
    return result
