"""Snake on one board: a plain ``gymnasium.Env`` in Python and numpy.

This is the single-board twin of the batched :class:`rlperf.env.vector.VectorSnake`: the same rules, the same
observations, stepped one board at a time on the host. It exists for Gymnasium interop
(``gymnasium.make("rlperf/Snake-v0")``, ``check_env``, Stable-Baselines3) and as the slow form of
the ``env.backend`` knob (``gym-sync`` / ``gym-async`` vector wrappers over it, docs/bottlenecks.md §5).

Rules (shared with the vector env, which a cross-test compares against this one):

- Board ``size`` × ``size``, cells ``(row, col)``, row 0 at the top, linear index
  ``row * size + col``; outside the board is wall.
- Directions: 0 up, 1 right, 2 down, 3 left. Actions are relative to the heading ``d``:
  0 straight (``d``), 1 turn right (``(d + 1) % 4``), 2 turn left (``(d + 3) % 4``).
- A move into the wall, or into a segment other than the tail, kills (reward -1, terminated).
  The tail leaves its cell in the same step, so following it is legal.
- Eating the fruit grows the snake by one (reward +1) and respawns the fruit on a uniformly drawn
  free cell; filling the board is a win (terminated, no fruit left).
- Truncated after ``hunger`` steps in a row without a fruit (default ``size * size``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces

from rlperf.errors import ConfigError
from rlperf.env.floodfill import bfs_count
import itertools

Cell = tuple[int, int]

#: Row/column step of each absolute direction: up, right, down, left.
DELTAS: tuple[Cell, ...] = ((-1, 0), (0, 1), (1, 0), (0, -1))
#: Absolute-direction offset of each relative action: straight, turn right, turn left.
TURNS: tuple[int, ...] = (0, 1, 3)
HEAD_GLYPHS = "^>v<"

OBS_MODES = ("features", "grid")
FLOOD_FILL_MODES = ("off", "bfs", "tensor")
HOST_DEVICES = ("cpu", "auto")
NUM_BASE_FEATURES = 11
NUM_FLOOD_FEATURES = 3


#: ``rgb_array`` frames: pixels per cell, and the colour of each cell kind (see ``CELL_KINDS``).
CELL_PIXELS = 16
CELL_KINDS = ("empty", "body", "head", "fruit", "wall")
PALETTE = np.array([[24, 24, 24], [46, 160, 67], [148, 230, 120], [220, 50, 47], [96, 96, 96]], dtype=np.uint8)
EMPTY, BODY, HEAD, FRUIT, WALL = range(len(CELL_KINDS))


def render_frames(kinds: np.ndarray, pixels: int = CELL_PIXELS) -> np.ndarray:
    """Boards as images: ``kinds`` ``(..., S, S)`` cell kinds -> ``(..., (S+2)*pixels, (S+2)*pixels, 3)`` uint8.

    Each board is framed by a one-cell wall, and every cell is a ``pixels``-wide square of its
    kind's colour (``PALETTE``). The vector env renders a batch of boards with the same function.
    """
    framed = np.pad(kinds, [(0, 0)] * (kinds.ndim - 2) + [(1, 1), (1, 1)], constant_values=WALL)
    image = PALETTE[framed]
    return image.repeat(pixels, axis=-3).repeat(pixels, axis=-2)


def board_kinds(size: int, body: list[Cell], fruit: Cell | None) -> np.ndarray:
    """The ``(size, size)`` cell kinds of one board: body, head (``body[0]``), fruit, empty."""
    kinds = np.full((size, size), EMPTY, dtype=np.uint8)
    for cell in body[1:]:
        kinds[cell] = BODY
    if body:
        kinds[body[0]] = HEAD
    if fruit is not None:
        kinds[fruit] = FRUIT
    return kinds


def render_board(size: int, body: list[Cell], direction: int, fruit: Cell | None) -> str:
    """Draw one board as text.

    ``body`` is the snake's cells, head first. The board is framed by ``#``; ``.`` is an empty cell,
    ``o`` a body segment, ``^ > v <`` the head pointing in ``direction`` and ``*`` the fruit.
    Rows are joined by newlines, with no trailing newline.
    """
    rows = [["."] * size for _ in range(size)]
    for row, col in body[1:]:
        rows[row][col] = "o"
    if body:
        head_row, head_col = body[0]
        rows[head_row][head_col] = HEAD_GLYPHS[direction]
    if fruit is not None:
        rows[fruit[0]][fruit[1]] = "*"
    border = "#" * (size + 2)
    return "\n".join([border, *("#" + "".join(row) + "#" for row in rows), border])


class SnakeEnv(gymnasium.Env):
    """One Snake board as a ``gymnasium.Env``; see the module docstring for the rules.

    Args:
        size: board side, at least 4.
        obs: ``"features"`` (float32 vector of 11, or 14 with flood fill) or ``"grid"`` (float32
            ``(3, size, size)`` planes: body, head, fruit).
        flood_fill: ``"off"``, ``"bfs"`` or ``"tensor"``. Both non-off values give the same three
            extra features here (a host BFS on one board); ``"tensor"`` is accepted so the same
            keyword works for the vector env. Ignored for ``obs="grid"``.
        initial_length: snake length after ``reset``, 1 to ``size``.
        hunger: steps without a fruit before truncation; ``None`` means ``size * size``.
        render_mode: ``None``, ``"ansi"`` (the board as text) or ``"rgb_array"`` (an
            ``(H, W, 3)`` uint8 image, ``CELL_PIXELS`` per cell, for video recorders).
        device: accepted for keyword symmetry with ``VectorSnake``; this env always runs on the
            host, so only ``None``, ``"cpu"`` and ``"auto"`` are allowed.
        kernel: accepted for keyword symmetry with ``VectorSnake`` (``env.kernel``); one board is
            always plain Python here, so only ``None``, ``"auto"`` and ``"ops"`` are allowed.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 10}  # noqa: RUF012 (gymnasium's API)

    def __init__(
        self,
        size: int = 10,
        obs: str = "features",
        flood_fill: str = "off",
        initial_length: int = 3,
        hunger: int | None = None,
        render_mode: str | None = None,
        device: Any = None,
        kernel: str | None = None,
    ) -> None:
        if not _is_int(size) or size < 4:
            raise ConfigError(f"size must be an integer >= 4, got {size!r}")
        if obs not in OBS_MODES:
            raise ConfigError(f"obs must be one of {', '.join(OBS_MODES)}; got {obs!r}")
        if flood_fill not in FLOOD_FILL_MODES:
            raise ConfigError(f"flood_fill must be one of {', '.join(FLOOD_FILL_MODES)}; got {flood_fill!r}")
        if not _is_int(initial_length) or not 1 <= initial_length <= size:
            raise ConfigError(f"initial_length must be an integer from 1 to size={size}, got {initial_length!r}")
        if hunger is not None and (not _is_int(hunger) or hunger <= 0):
            raise ConfigError(f"hunger must be a positive integer or None, got {hunger!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode must be None, 'ansi' or 'rgb_array', got {render_mode!r}")
        if device is not None and str(device).strip().lower() not in HOST_DEVICES:
            raise ConfigError(
                f"device must be None, 'cpu' or 'auto' for SnakeEnv (it runs on the host), got {device!r}",
                hint="use VectorSnake for GPU boards",
            )

        if kernel not in (None, "auto", "ops"):
            raise ConfigError(
                f"kernel={kernel!r} does not apply to SnakeEnv (one board in plain Python)",
                hint="the fused kernel steps VectorSnake: gymnasium.make_vec(..., vectorization_mode='vector_entry_point')",
            )

        self.size = int(size)
        self.obs_mode = obs
        self.flood_fill = flood_fill
        self.initial_length = int(initial_length)
        self.hunger = self.size * self.size if hunger is None else int(hunger)
        self.render_mode = render_mode

        self.action_space = spaces.Discrete(3)
        if obs == "grid":
            shape: tuple[int, ...] = (3, self.size, self.size)
        else:
            shape = (NUM_BASE_FEATURES + (NUM_FLOOD_FEATURES if self._uses_flood_fill else 0),)
        self._obs_shape: tuple[int, ...] = tuple(shape)
        self.observation_space = spaces.Box(0.0, 1.0, shape, dtype=np.float32)

        # Episode state. `_occupied` mirrors `_body` so collision checks are one array lookup.
        self._body: deque[Cell] = deque()
        self._occupied = np.zeros((self.size, self.size), dtype=bool)
        self._direction = 0
        self._fruit: Cell | None = None
        self._steps_since_fruit = 0
        self._score = 0
        self._steps = 0

    @property
    def _uses_flood_fill(self) -> bool:
        return self.obs_mode == "features" and self.flood_fill != "off"

    # ------------------------------------------------------------------ gymnasium API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode: a straight snake in a random direction and a fruit on a free cell."""
        super().reset(seed=seed)
        rng = self.np_random
        size, length = self.size, self.initial_length

        direction = int(rng.integers(4))
        d_row, d_col = DELTAS[direction]
        # The head may sit wherever the body, trailing straight behind it, stays on the board.
        row_lo, row_hi = _head_range(d_row, length, size)
        col_lo, col_hi = _head_range(d_col, length, size)
        n_cols = col_hi - col_lo + 1
        index = int(rng.integers((row_hi - row_lo + 1) * n_cols))
        head_row, head_col = row_lo + index // n_cols, col_lo + index % n_cols

        self._body = deque((head_row - k * d_row, head_col - k * d_col) for k in range(length))
        self._occupied.fill(False)
        for cell in self._body:
            self._occupied[cell] = True
        self._direction = direction
        self._steps_since_fruit = 0
        self._score = 0
        self._steps = 0
        self._fruit = self._spawn_fruit()
        return self.observe(), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        """Move one cell straight, right or left of the heading (actions 0, 1, 2)."""
        if not self._body:
            raise RuntimeError("call reset() (or set_state()) before step()")
        turn = int(action)
        if not 0 <= turn <= 2:
            raise ValueError(f"action must be 0 (straight), 1 (right) or 2 (left), got {action!r}")

        self._steps += 1
        direction = (self._direction + TURNS[turn]) % 4
        target = self._target(direction)
        eat = target is not None and target == self._fruit
        if target is None or (not eat and self._hits_body(target)):
            # Death leaves the board as it was: the snake does not enter the wall or itself.
            return self.observe(), -1.0, True, False, self._info()

        self._direction = direction
        self._body.appendleft(target)
        if eat:
            self._occupied[target] = True
            self._score += 1
            self._steps_since_fruit = 0
            reward = 1.0
        else:
            # Free the tail before marking the head: the head may be entering the tail's cell.
            self._occupied[self._body.pop()] = False
            self._occupied[target] = True
            self._steps_since_fruit += 1
            reward = 0.0

        won = eat and len(self._body) == self.size * self.size
        if eat:
            self._fruit = None if won else self._spawn_fruit()
        terminated = won
        truncated = not terminated and self._steps_since_fruit >= self.hunger
        return self.observe(), reward, terminated, truncated, self._info()

    def render(self) -> str | np.ndarray | None:
        """The board as text (``ansi``) or as an image (``rgb_array``); ``None``, with a warning,
        without a render mode."""
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without a render_mode; use SnakeEnv(render_mode='ansi' or 'rgb_array')")
            return None
        if self.render_mode == "rgb_array":
            return render_frames(board_kinds(self.size, list(self._body), self._fruit))
        return render_board(self.size, list(self._body), self._direction, self._fruit)

    # ------------------------------------------------------------------ state access

    def get_state(self) -> dict[str, Any]:
        """The full board state, in the form ``set_state`` accepts (body head first)."""
        return {
            "body": list(self._body),
            "direction": self._direction,
            "fruit": self._fruit,
            "steps_since_fruit": self._steps_since_fruit,
            "score": self._score,
            "steps": self._steps,
        }

    def set_state(
        self,
        body: list[Cell],
        direction: int,
        fruit: Cell | None,
        steps_since_fruit: int = 0,
        score: int = 0,
        steps: int = 0,
    ) -> None:
        """Put the board in a given state (for tests and cross-checks), after validating it.

        ``body`` lists the snake's cells head first; consecutive cells must be 4-adjacent, all
        distinct and on the board. ``fruit`` must be a free cell, or ``None`` only when the body
        fills the board. Raises ``ValueError`` naming what is wrong.
        """
        size = self.size
        cells = [(int(row), int(col)) for row, col in body]
        if not cells:
            raise ConfigError("body must have at least one cell")
        for row, col in cells:
            if not (0 <= row < size and 0 <= col < size):
                raise ConfigError(f"body cell {(row, col)} is outside the {size}x{size} board")
        if len(set(cells)) != len(cells):
            raise ConfigError("body cells must be distinct")
        for (r0, c0), (r1, c1) in itertools.pairwise(cells):
            if abs(r0 - r1) + abs(c0 - c1) != 1:
                raise ConfigError(f"body cells {(r0, c0)} and {(r1, c1)} are not adjacent")
        if not _is_int(direction) or not 0 <= direction <= 3:
            raise ConfigError(f"direction must be 0 (up), 1 (right), 2 (down) or 3 (left), got {direction!r}")
        if fruit is None:
            if len(cells) != size * size:
                raise ConfigError("fruit may be None only when the body fills the board")
        else:
            fruit = (int(fruit[0]), int(fruit[1]))
            if not (0 <= fruit[0] < size and 0 <= fruit[1] < size):
                raise ConfigError(f"fruit {fruit} is outside the {size}x{size} board")
            if fruit in cells:
                raise ConfigError(f"fruit {fruit} is on the snake's body")
        for name, value in (("steps_since_fruit", steps_since_fruit), ("score", score), ("steps", steps)):
            if not _is_int(value) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")

        self._body = deque(cells)
        self._occupied.fill(False)
        for cell in cells:
            self._occupied[cell] = True
        self._direction = int(direction)
        self._fruit = fruit
        self._steps_since_fruit = int(steps_since_fruit)
        self._score = int(score)
        self._steps = int(steps)

    def observe(self) -> np.ndarray:
        """The observation of the current state (a fresh array, as ``reset`` and ``step`` return)."""
        return self._grid() if self.obs_mode == "grid" else self._features()

    # ------------------------------------------------------------------ internals

    def _info(self) -> dict[str, Any]:
        return {"score": self._score, "snake_length": len(self._body), "steps": self._steps}

    def _target(self, direction: int) -> Cell | None:
        """The cell one step from the head in ``direction``, or ``None`` if that is the wall."""
        head_row, head_col = self._body[0]
        d_row, d_col = DELTAS[direction]
        row, col = head_row + d_row, head_col + d_col
        if 0 <= row < self.size and 0 <= col < self.size:
            return row, col
        return None

    def _hits_body(self, cell: Cell) -> bool:
        """Whether ``cell`` holds a segment that stays put this step (anything but the tail)."""
        return bool(self._occupied[cell]) and cell != self._body[-1]

    def _spawn_fruit(self) -> Cell:
        """A uniformly drawn free cell (the caller guarantees one exists)."""
        free = np.flatnonzero(~self._occupied)
        index = int(free[self.np_random.integers(len(free))])
        return divmod(index, self.size)

    def _features(self) -> np.ndarray:
        features = np.zeros(self._obs_shape, dtype=np.float32)
        head_row, head_col = self._body[0]
        for slot, turn in enumerate(TURNS):
            target = self._target((self._direction + turn) % 4)
            deadly = target is None or (target != self._fruit and self._hits_body(target))
            features[slot] = deadly
            if self._uses_flood_fill and target is not None and not deadly:
                features[NUM_BASE_FEATURES + slot] = self._flood_fraction(target)
        features[3 + self._direction] = 1.0
        if self._fruit is not None:
            fruit_row, fruit_col = self._fruit
            features[7] = fruit_col < head_col
            features[8] = fruit_col > head_col
            features[9] = fruit_row < head_row
            features[10] = fruit_row > head_row
        return features

    def _flood_fraction(self, target: Cell) -> float:
        """Share of the free cells reachable from ``target`` once the snake has moved there.

        Blocked are the segments that stay: all but the tail when the move does not eat, all of
        them when it eats (the tail stays). ``target`` itself is never blocked.
        """
        tail = self._body[-1]
        frees_tail = target != self._fruit
        # Borrow the occupancy array for the BFS rather than building a new one each call.
        if frees_tail:
            self._occupied[tail] = False
        try:
            reachable = bfs_count(self._occupied, target[0] * self.size + target[1])
        finally:
            self._occupied[tail] = True
        free = self.size * self.size - (len(self._body) - frees_tail)
        return reachable / free

    def _grid(self) -> np.ndarray:
        grid = np.zeros((3, self.size, self.size), dtype=np.float32)
        grid[0][self._occupied] = 1.0
        grid[1][self._body[0]] = 1.0
        if self._fruit is not None:
            grid[2][self._fruit] = 1.0
        return grid


def _head_range(step: int, length: int, size: int) -> tuple[int, int]:
    """Head coordinates along one axis that keep a straight body of ``length`` behind it on board."""
    if step < 0:  # moving toward 0: the body trails toward size - 1
        return 0, size - length
    if step > 0:
        return length - 1, size - 1
    return 0, size - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
