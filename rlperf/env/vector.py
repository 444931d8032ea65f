"""Snake, batched: N boards stepped at once from preallocated tensors on one device.

Rules (shared with the single-board :class:`rlperf.single_snake.SnakeEnv`):

- A ``size`` x ``size`` board, walls around; cells are ``(row, col)`` with row 0 at the top and
  linear index ``row * size + col``. Absolute directions: 0 up, 1 right, 2 down, 3 left.
- Actions are relative to the heading: 0 straight, 1 turn right, 2 turn left.
- A new episode starts with a straight snake of ``initial_length`` in a uniformly random position
  and heading, and one fruit on a uniformly random free cell.
- Moving off the board, or into a cell held by a segment other than the tail, is death (reward
  -1, terminated). The tail leaves its cell in the same step unless the snake eats, so moving into
  the cell the tail is leaving is legal. Eating the fruit gives +1, grows the snake by one and
  respawns the fruit on a free cell. Filling the whole board is a win (terminated, with the
  fruit's +1). An episode is truncated after ``hunger`` steps without a fruit.

Performance notes. Each board keeps its body as a ring of cell indices (head pointer + length) and
an occupancy grid with one extra always-occupied "wall" column, so a step is O(N) gathers and
scatters: no pass over every cell of every board unless the observation asks for one (``grid``
observations, flood fill). Nothing in :meth:`VectorSnake.step` synchronises with the host on CUDA:
fruit respawn and board resets are computed for all boards and selected with ``torch.where``. On
the CPU, where a host read costs nothing, those two rare operations work on the subset of boards
that need them instead.

Autoreset: ``AutoresetMode.SAME_STEP``. When a board's episode ends, the observation returned for
it is already the first observation of its next episode, and ``infos["final_obs"]`` holds the
observation the episode ended on. This is the mode a replay buffer wants: the transition
``(obs, action, reward, final_obs, terminated)`` is complete in the step that produced it, and no
step is wasted on a reset. Unlike Gymnasium's own vector envs, ``infos["final_obs"]`` is a dense
tensor holding the post-step observation of *every* board (equal to the returned observation
where the board did not reset), so a trainer can push it without a masked merge;
``infos["_final_obs"]`` marks the boards whose episode ended.

Seeding: ``reset(seed=s)`` seeds one generator on the env's device. Trajectories are reproducible
for the same ``(seed, num_envs, device)``; a board's random stream depends on ``num_envs``,
because all boards draw from one generator in one call (that keeps a step at one kernel per draw).

Returned tensors are the env's own buffers: an observation stays valid until the step after the
next one (two buffers alternate, so ``obs = next_obs`` hand-offs work); ``final_obs``, rewards,
flags and the episode statistics are overwritten by the next step. Clone what you keep longer.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlperf.env import floodfill
from rlperf.device import resolve_device
from rlperf.env.single import render_board
import itertools

# Absolute directions: up, right, down, left as (row, col) deltas.
DIRECTION_DELTAS = ((-1, 0), (0, 1), (1, 0), (0, -1))
# Relative action -> change of heading: straight, turn right, turn left.
ACTION_TURNS = (0, 1, 3)
N_ACTIONS = len(ACTION_TURNS)
OBS_MODES = ("features", "grid")
FLOOD_FILL_MODES = ("off", "bfs", "tensor")
N_FEATURES = 11
N_FLOOD_FEATURES = 3
# Boards up to about 34 x 34 use a lookup table for the heading and fruit features.
HEADING_FRUIT_TABLE_BYTES = 64 * 2**20


def _check_arguments(num_envs: int, size: int, obs: str, flood_fill: str, initial_length: int, hunger: int | None) -> None:
    if not isinstance(num_envs, int) or num_envs <= 0:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    if not isinstance(size, int) or size < 4:
        raise ValueError(f"size must be an integer >= 4, got {size!r}")
    if obs not in OBS_MODES:
        raise ValueError(f"obs must be one of {', '.join(OBS_MODES)}, got {obs!r}")
    if flood_fill not in FLOOD_FILL_MODES:
        raise ValueError(f"flood_fill must be one of {', '.join(FLOOD_FILL_MODES)}, got {flood_fill!r}")
    if not isinstance(initial_length, int) or not 1 <= initial_length <= size:
        raise ValueError(f"initial_length must be between 1 and size ({size}), got {initial_length!r}")
    if hunger is not None and (not isinstance(hunger, int) or hunger <= 0):
        raise ValueError(f"hunger must be a positive integer or None, got {hunger!r}")


def observation_shape(size: int, obs: str, flood_fill: str) -> tuple[int, ...]:
    """Shape of one board's observation."""
    if obs == "grid":
        return (3, size, size)
    return (N_FEATURES + (N_FLOOD_FEATURES if flood_fill != "off" else 0),)


class VectorSnake(VectorEnv):
    """``num_envs`` Snake boards stepped at once on ``device`` (Gymnasium 1.x ``VectorEnv``).

    Args:
        num_envs: number of boards.
        size: board side (>= 4).
        obs: ``"features"`` (11 floats, 14 with flood fill) or ``"grid"`` (3 x size x size planes).
        flood_fill: ``"off"``, ``"bfs"`` (Python BFS per board on the CPU, the slow reference) or
            ``"tensor"`` (batched on the device).
        initial_length: snake length at the start of an episode.
        hunger: steps without a fruit before truncation (default ``size * size``).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        render_mode: ``None`` or ``"ansi"``.
    """

    metadata = {"render_modes": ["ansi"], "autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012 (gymnasium's API)

    def __init__(
        self,
        num_envs: int = 256,
        size: int = 10,
        obs: str = "features",
        flood_fill: str = "off",
        initial_length: int = 3,
        hunger: int | None = None,
        device: str | torch.device = "auto",
        render_mode: str | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        _check_arguments(num_envs, size, obs, flood_fill, initial_length, hunger)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if max_episode_steps is not None:
            raise ValueError("max_episode_steps is not supported by VectorSnake; use hunger=")
        self.device = resolve_device(device)
        self.num_envs = num_envs
        self.size = size
        self.obs_mode = obs
        self.flood_fill = flood_fill
        self.initial_length = initial_length
        self.hunger = hunger if hunger is not None else size * size
        self.render_mode = render_mode
        self.cells = size * size
        # Host reads are free on the CPU, so rare per-board work (resets, fruit) runs on the subset
        # of boards that need it there; on CUDA it runs densely to keep step() sync-free.
        self.dense = self.device.type != "cpu"

        shape = observation_shape(size, obs, flood_fill)
        self.single_observation_space = gymnasium.spaces.Box(0.0, 1.0, shape, np.float32)
        self.single_action_space = gymnasium.spaces.Discrete(3)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

        self._allocate(shape)
        self._seeded = False

    # ------------------------------------------------------------------ setup
    def _allocate(self, obs_shape: tuple[int, ...]) -> None:
        n, c, s, dev = self.num_envs, self.cells, self.size, self.device
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        # Neighbour table: nbr[cell * 4 + direction] -> next cell, or `c` (the wall column) if the
        # move leaves the board. Row `c` (the wall itself) maps to the wall.
        nbr = torch.full((c + 1, 4), c, **i64)
        for cell in range(c):
            row, col = divmod(cell, s)
            for d, (dr, dc) in enumerate(DIRECTION_DELTAS):
                r, cc = row + dr, col + dc
                if 0 <= r < s and 0 <= cc < s:
                    nbr[cell, d] = r * s + cc
        self._nbr = nbr.reshape(-1)
        self._turns = torch.tensor(ACTION_TURNS, **i64)
        self._rel_turns = torch.tensor(ACTION_TURNS, **i64).view(1, 3)
        self._row = torch.arange(c + 1, **i64) // s
        self._col = torch.arange(c + 1, **i64) % s
        self._delta = torch.tensor(DIRECTION_DELTAS, **i64)  # (4, 2)
        self._heading_fruit = self._heading_fruit_table() if 4 * c * c * 8 * 4 <= HEADING_FRUIT_TABLE_BYTES else None
        self._body_steps = torch.arange(self.initial_length, **i64)

        self._gen = torch.Generator(device=dev)
        self._occ = torch.zeros((n, c + 1), dtype=torch.bool, device=dev)  # last column: the wall
        self._ring = torch.zeros((n, c), **i64)  # body cells, head at _head_ptr
        self._head_ptr = torch.zeros(n, **i64)
        self._length = torch.zeros(n, **i64)
        self._head = torch.zeros(n, **i64)
        self._dir = torch.zeros(n, **i64)
        self._fruit = torch.zeros(n, **i64)
        self._hungry_for = torch.zeros(n, **i64)  # steps since the last fruit
        self._ep_len = torch.zeros(n, **i64)
        self._ep_score = torch.zeros(n, **i64)
        self._ep_return = torch.zeros(n, dtype=torch.float32, device=dev)

        self._obs = [torch.zeros((n, *obs_shape), dtype=torch.float32, device=dev) for _ in range(2)]
        self._obs_index = 0
        self._final_obs = torch.zeros((n, *obs_shape), dtype=torch.float32, device=dev)
        self._final_score = torch.zeros(n, **i64)
        self._final_len = torch.zeros(n, **i64)
        self._final_return = torch.zeros(n, dtype=torch.float32, device=dev)
        self._all = torch.ones(n, dtype=torch.bool, device=dev)

    def _heading_fruit_table(self) -> torch.Tensor:
        """Features 3..10 for every (heading, head cell, fruit cell): one gather per observation."""
        c = self.cells
        direction = torch.arange(4, device=self.device).view(4, 1, 1).expand(4, c, c)
        hr, hc = self._row[:c].view(1, c, 1), self._col[:c].view(1, c, 1)
        fr, fc = self._row[:c].view(1, 1, c), self._col[:c].view(1, 1, c)
        table = torch.zeros((4, c, c, 8), dtype=torch.float32, device=self.device)
        table[..., 0:4] = torch.nn.functional.one_hot(direction, 4).float()
        for k, flag in enumerate((fc < hc, fc > hc, fr < hr, fr > hr)):
            table[..., 4 + k] = flag.expand(4, c, c).float()
        return table.view(4 * c * c, 8)

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[torch.Tensor, dict]:
        """Start a new episode on every board; ``seed`` seeds the env's generator."""
        if seed is not None:
            if not isinstance(seed, (int, np.integer)):
                raise ValueError(f"seed must be an int (one generator drives all boards), got {type(seed).__name__}")
            self._gen.manual_seed(int(seed))
            self._seeded = True
        elif not self._seeded:
            self._gen.manual_seed(int(np.random.SeedSequence().entropy) % (2**63))  # type: ignore[arg-type]
            self._seeded = True
        self._reset_boards(self._all, dense=True)
        self._respawn_fruit(self._all, dense=True)
        out = self._next_obs_buffer()
        self._observe(out)
        return out, {}

    def step(self, actions: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Advance every board by one move; finished boards restart in the same step."""
        actions = torch.as_tensor(actions, device=self.device).long()
        c = self.cells

        # Turn and look ahead.
        direction = (self._dir + self._turns[actions]) % 4
        target = self._nbr[self._head * 4 + direction]
        tail = self._ring.gather(1, ((self._head_ptr - self._length + 1) % c).unsqueeze(1)).squeeze(1)
        occupied = self._occ.gather(1, target.unsqueeze(1)).squeeze(1)  # the wall column is always occupied
        dead = occupied & (target != tail)  # the tail leaves this step, so its cell is free
        alive = ~dead
        eat = target == self._fruit

        # Move the living: free the tail unless eating, then place the head. A dead board stays
        # where it was (its final observation shows the position it died in).
        keep_tail = ~(alive & ~eat)
        self._occ.scatter_(1, tail.unsqueeze(1), keep_tail.unsqueeze(1))
        new_head = torch.where(alive, target, self._head)
        self._dir = torch.where(alive, direction, self._dir)
        self._occ.scatter_(1, new_head.unsqueeze(1), True)
        self._head_ptr = torch.where(alive, (self._head_ptr + 1) % c, self._head_ptr)
        self._ring.scatter_(1, self._head_ptr.unsqueeze(1), new_head.unsqueeze(1))
        self._head = new_head
        self._length = self._length + eat
        self._hungry_for = torch.where(eat, 0, self._hungry_for + 1)

        rewards = eat.float() - dead.float()
        win = eat & (self._length == c)
        terminated = dead | win
        truncated = ~terminated & (self._hungry_for >= self.hunger)
        done = terminated | truncated
        self._ep_len += 1
        self._ep_score += eat
        self._ep_return += rewards

        # Final observation of every board (the next observation where the episode goes on).
        self._respawn_fruit(eat & ~win, dense=self.dense)
        self._observe(self._final_obs)
        self._final_score.copy_(self._ep_score)
        self._final_len.copy_(self._ep_len)
        self._final_return.copy_(self._ep_return)

        # Same-step autoreset.
        out = self._next_obs_buffer()
        out.copy_(self._final_obs)
        if self.dense:
            self._reset_boards(done, dense=True)
            self._respawn_fruit(done, dense=True)
            self._observe(out)
        else:
            index = done.nonzero().squeeze(1)
            if index.numel():
                mask = torch.zeros_like(done).index_fill_(0, index, True)
                self._reset_boards(mask, dense=False)
                self._respawn_fruit(mask, dense=False)
                self._observe(out, index)

        infos = {
            "final_obs": self._final_obs,
            "_final_obs": done,
            "episode": {"score": self._final_score, "length": self._final_len, "return": self._final_return},
            "_episode": done,
        }
        return out, rewards, terminated, truncated, infos

    def render(self) -> str | None:  # type: ignore[override]
        """Board 0 as text (``render_mode="ansi"``)."""
        if self.render_mode != "ansi":
            return None
        return self.render_text(0)

    def render_text(self, index: int = 0) -> str:
        """Board ``index`` as text: ``#`` walls, ``o`` body, ``^>v<`` head, ``*`` fruit."""
        board = self.get_board(index)
        return render_board(self.size, board["body"], board["direction"], board["fruit"])

    # ------------------------------------------------------------------ state access (tests, rendering)
    def get_board(self, index: int) -> dict[str, Any]:
        """One board's state as plain Python values: body (head first), direction, fruit, counters."""
        length = int(self._length[index])
        ptr = int(self._head_ptr[index])
        ring = self._ring[index].tolist()
        body = [divmod(ring[(ptr - k) % self.cells], self.size) for k in range(length)]
        fruit = int(self._fruit[index])
        won = length == self.cells
        return {
            "body": body,
            "direction": int(self._dir[index]),
            "fruit": None if won else divmod(fruit, self.size),
            "steps_since_fruit": int(self._hungry_for[index]),
            "score": int(self._ep_score[index]),
            "steps": int(self._ep_len[index]),
        }

    def set_board(
        self,
        index: int,
        body: list[tuple[int, int]],
        direction: int,
        fruit: tuple[int, int] | None,
        steps_since_fruit: int = 0,
        score: int = 0,
        steps: int = 0,
    ) -> None:
        """Place a hand-built position on board ``index`` (validated like ``SnakeEnv.set_state``)."""
        s = self.size
        cells = [r * s + c for r, c in body]
        if not body or len(set(cells)) != len(cells):
            raise ValueError("body must be a non-empty list of distinct cells")
        if any(not (0 <= r < s and 0 <= c < s) for r, c in body):
            raise ValueError("body cells must lie on the board")
        if any(abs(a[0] - b[0]) + abs(a[1] - b[1]) != 1 for a, b in itertools.pairwise(body)):
            raise ValueError("each body segment must be adjacent to the next")
        if direction not in range(4):
            raise ValueError("direction must be 0 (up), 1 (right), 2 (down) or 3 (left)")
        if fruit is not None and fruit[0] * s + fruit[1] in cells:
            raise ValueError("fruit must not lie on the body")
        length = len(cells)
        self._occ[index] = False
        self._occ[index, self.cells] = True
        self._occ[index, cells] = True
        ring = torch.zeros(self.cells, dtype=torch.int64)
        ring[:length] = torch.tensor(cells[::-1])  # tail first, head at length - 1
        self._ring[index] = ring.to(self.device)
        self._head_ptr[index] = length - 1
        self._length[index] = length
        self._head[index] = cells[0]
        self._dir[index] = direction
        # A full board has no fruit; parking it under the head keeps every fruit feature at 0.
        self._fruit[index] = cells[0] if fruit is None else fruit[0] * s + fruit[1]
        self._hungry_for[index] = steps_since_fruit
        self._ep_score[index] = score
        self._ep_len[index] = steps
        self._ep_return[index] = float(score)
        current = self._obs[self._obs_index]
        self._observe(current)

    @property
    def observations(self) -> torch.Tensor:
        """The most recent observation batch (what the last reset/step returned)."""
        return self._obs[self._obs_index]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this env is (for checkpoints)."""
        names = ("_occ", "_ring", "_head_ptr", "_length", "_head", "_dir", "_fruit", "_hungry_for",
                 "_ep_len", "_ep_score", "_ep_return")
        state = {name: getattr(self, name).cpu().clone() for name in names}
        state["obs"] = self.observations.cpu().clone()
        state["generator"] = self._gen.get_state()
        state["shape"] = (self.num_envs, self.size, self.obs_mode, self.flood_fill, self.initial_length, self.hunger)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        shape = (self.num_envs, self.size, self.obs_mode, self.flood_fill, self.initial_length, self.hunger)
        if tuple(state["shape"]) != shape:
            raise ValueError(f"env state is for {tuple(state['shape'])}, this env is {shape}")
        for name, value in state.items():
            if name.startswith("_"):
                getattr(self, name).copy_(value.to(self.device))
        self._obs_index = 0
        self._obs[0].copy_(state["obs"].to(self.device))
        self._gen.set_state(state["generator"])
        self._seeded = True

    # ------------------------------------------------------------------ internals
    def _next_obs_buffer(self) -> torch.Tensor:
        self._obs_index ^= 1
        return self._obs[self._obs_index]

    def _spawn(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Random start positions for ``n`` boards: heading, head cell and body cells (head first)."""
        s, length, dev, g = self.size, self.initial_length, self.device, self._gen
        direction = torch.randint(0, 4, (n,), generator=g, device=dev)
        along = torch.randint(0, s - length + 1, (n,), generator=g, device=dev)  # room for the body behind
        across = torch.randint(0, s, (n,), generator=g, device=dev)
        # Heading up: the body hangs below the head, so the head row is in [0, s - length].
        row = torch.where(direction == 0, along, torch.where(direction == 2, s - 1 - along, across))
        col = torch.where(direction == 3, along, torch.where(direction == 1, s - 1 - along, across))
        delta = self._delta[direction]  # (n, 2)
        rows = row.unsqueeze(1) - self._body_steps * delta[:, :1]
        cols = col.unsqueeze(1) - self._body_steps * delta[:, 1:]
        body = rows * s + cols  # (n, length), head first
        return direction, body[:, 0], body

    def _reset_boards(self, mask: torch.Tensor, dense: bool) -> None:
        """Start new episodes on the boards in ``mask``."""
        length, c = self.initial_length, self.cells
        if dense:
            direction, head, body = self._spawn(self.num_envs)
            m = mask.unsqueeze(1)
            self._occ &= ~m
            self._occ[:, c] = True
            self._occ.scatter_(1, body, m | self._occ.gather(1, body))
            self._ring[:, :length] = torch.where(m, body.flip(1), self._ring[:, :length])
            self._dir = torch.where(mask, direction, self._dir)
            self._head = torch.where(mask, head, self._head)
            zero = torch.zeros_like(self._length)
            self._head_ptr = torch.where(mask, zero + (length - 1), self._head_ptr)
            self._length = torch.where(mask, zero + length, self._length)
            for counter in (self._hungry_for, self._ep_len, self._ep_score, self._ep_return):
                counter.masked_fill_(mask, 0)
            return
        index = mask.nonzero().squeeze(1)
        direction, head, body = self._spawn(index.numel())
        occ = torch.zeros((index.numel(), c + 1), dtype=torch.bool, device=self.device)
        occ[:, c] = True
        occ.scatter_(1, body, True)
        self._occ[index] = occ
        self._ring[index, :length] = body.flip(1)
        self._dir[index] = direction
        self._head[index] = head
        self._head_ptr[index] = length - 1
        self._length[index] = length
        for counter in (self._hungry_for, self._ep_len, self._ep_score, self._ep_return):
            counter[index] = 0

    def _respawn_fruit(self, mask: torch.Tensor, dense: bool) -> None:
        """Put a fruit on a uniformly random free cell of each board in ``mask``."""
        c = self.cells
        if dense:
            scores = torch.rand((self.num_envs, c), generator=self._gen, device=self.device)
            scores.masked_fill_(self._occ[:, :c], -1.0)
            self._fruit = torch.where(mask, scores.argmax(1), self._fruit)
            return
        index = mask.nonzero().squeeze(1)
        if index.numel() == 0:
            return
        scores = torch.rand((index.numel(), c), generator=self._gen, device=self.device)
        scores.masked_fill_(self._occ[index, :c], -1.0)
        self._fruit[index] = scores.argmax(1)

    def _observe(self, out: torch.Tensor, index: torch.Tensor | None = None) -> None:
        """Write observations into ``out`` for all boards, or only the boards in ``index``."""
        if index is not None:
            part = torch.empty_like(out[index])
            self._observe_into(part, index)
            out[index] = part
        else:
            self._observe_into(out, None)

    def _observe_into(self, out: torch.Tensor, index: torch.Tensor | None) -> None:
        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if index is None else t[index]

        occ, head, direction, fruit = pick(self._occ), pick(self._head), pick(self._dir), pick(self._fruit)
        n, c = head.shape[0], self.cells
        if self.obs_mode == "grid":
            planes = out.view(n, 3, c)
            planes[:, 0] = occ[:, :c]
            planes[:, 1].zero_().scatter_(1, head.unsqueeze(1), 1.0)
            planes[:, 2].zero_().scatter_(1, fruit.unsqueeze(1), 1.0)
            won = pick(self._length) == c  # no fruit on a full board
            planes[:, 2].masked_fill_(won.unsqueeze(1), 0.0)
            return

        # Danger straight / right / left: the wall column and every segment but the tail.
        dirs = (direction.unsqueeze(1) + self._rel_turns) % 4  # (n, 3)
        targets = self._nbr[head.unsqueeze(1) * 4 + dirs]
        ring, ptr, length = pick(self._ring), pick(self._head_ptr), pick(self._length)
        tail = ring.gather(1, ((ptr - length + 1) % c).unsqueeze(1))
        deadly = occ.gather(1, targets) & (targets != tail)
        out[:, 0:3] = deadly
        if self._heading_fruit is not None:
            # Heading one-hot and fruit-relative flags in one gather (a full board parks its
            # fruit under the head, so its flags are all 0 without a mask).
            out[:, 3:11] = self._heading_fruit[(direction * c + head) * c + fruit]
        else:
            out[:, 3:7] = 0.0
            out[:, 3:7].scatter_(1, direction.unsqueeze(1), 1.0)
            hr, hc, fr, fc = self._row[head], self._col[head], self._row[fruit], self._col[fruit]
            out[:, 7] = fc < hc
            out[:, 8] = fc > hc
            out[:, 9] = fr < hr
            out[:, 10] = fr > hr
        if self.flood_fill != "off":
            out[:, 11:14] = self._flood_features(occ[:, :c], targets, deadly, tail, fruit)

    def _flood_features(self, body: torch.Tensor, targets: torch.Tensor, deadly: torch.Tensor,
                        tail: torch.Tensor, fruit: torch.Tensor) -> torch.Tensor:
        """Fraction of the free cells reachable after each relative move (0 for a deadly move)."""
        n, c, s = body.shape[0], self.cells, self.size
        blocked = body.unsqueeze(1).repeat(1, 3, 1)  # (n, 3, c)
        # Unless the move eats, the tail leaves: its cell is free.
        eats = targets == fruit.unsqueeze(1)
        tail_index = tail.view(n, 1, 1).expand(n, 3, 1)
        blocked.scatter_(2, tail_index, blocked.gather(2, tail_index) & eats.unsqueeze(2))
        start = torch.where(deadly, 0, targets).clamp_(max=c - 1)
        fill = floodfill.reachable_tensor if self.flood_fill == "tensor" else floodfill.reachable_bfs
        reachable = fill(blocked.view(n * 3, s, s), start.reshape(-1)).view(n, 3)
        free = (c - blocked.sum(2)).clamp_(min=1)
        return torch.where(deadly, 0.0, reachable.float() / free.float())

    def close_extras(self, **kwargs: Any) -> None:
        pass
