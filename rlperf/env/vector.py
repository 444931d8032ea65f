"""Snake, batched: N boards stepped at once from preallocated tensors on one device.

Rules (shared with the single-board :class:`rlperf.env.single.SnakeEnv`):

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

Autoreset: ``AutoresetMode.SAME_STEP`` (``metadata["autoreset_mode"]`` and the ``autoreset_mode``
attribute). When a board's episode ends, the observation returned for it is already the first
observation of its next episode, and ``infos["final_obs"]`` holds the observation the episode
ended on. This is the mode a replay buffer wants: the transition ``(obs, action, reward,
final_obs, terminated)`` is complete in the step that produced it, and no step is wasted on a
reset. Unlike Gymnasium's own vector envs, ``infos["final_obs"]`` is a dense tensor holding the
post-step observation of *every* board (equal to the returned observation where the board did not
reset), so a trainer can push it without a masked merge; ``infos["_final_obs"]`` marks the boards
whose episode ended. ``infos["final_info"]`` holds, as Gymnasium's SAME_STEP vector envs do, what
the final step reports for them -- the episode's ``score`` (fruits), ``steps`` and ``return`` --
with ``infos["_final_info"]`` marking them; the key ``episode`` stays free for Gymnasium's
``RecordEpisodeStatistics``. Like ``final_obs``, the statistics are dense: read them where the mask
is set.

Two kernels step the boards (``kernel=``, the ``env.kernel`` knob), sharing one state layout and
one set of preallocated tensors: ``ops``, the batched tensor operators below (the readable
reference, and the form that runs on CUDA), and ``fused``, one compiled per-board step
(:mod:`rlperf.env.fused`, CPU). Given the same random draws they agree bit for bit on every field
of the state, the observations, rewards, flags, ``final_obs`` and episode statistics.
``kernel="auto"`` (the default) takes ``fused`` where it can run and says why not otherwise
(:attr:`VectorSnake.kernel_reason`).

Random draws: three uniforms per board and step (fruit after eating, start of a new episode, fruit
after that start), see :mod:`rlperf.env.fused`. ``reset(seed=s)`` seeds them; trajectories are
reproducible for the same ``(seed, num_envs, device, kernel)``. ``ops`` draws them from one
torch generator on the env's device for all boards at once, so a board's stream depends on
``num_envs``; ``fused`` computes them from a hash of (seed, board index, step), so board i's stream
does not depend on ``num_envs``. :meth:`VectorSnake.step_with_draws` injects explicit draws.

Returned tensors: with ``copy=True`` (the default) what a step or reset returns is the caller's, as
Gymnasium means it: new tensors every call, which nothing the env does later writes, resizes,
re-points or reads back -- the caller may keep them, change them in place, share their memory or
hold only their storage. The fused kernel writes a step's observation and ``final_obs`` straight
into a new tensor (so the env's own observation buffer is filled again only when
:attr:`VectorSnake.observations` is read); the ops kernel's, and the final counters, rewards and
flags, are cloned. Nothing of that memory is reused while anything may hold it: the allocator gets
it back only when its last holder lets go. The cost, a few allocations and views per step, is
measured against ``copy=False`` in BENCHMARKS.md. ``copy=False`` returns the env's own buffers,
valid until the next step -- the fast path, what rlperf's trainer uses: the next step overwrites
``final_obs``, rewards, flags and ``final_info``; an observation lasts one step longer (two buffers
alternate, so ``obs = next_obs`` hand-offs work).

Invalid input -- an action outside {0, 1, 2}, a float or bool action dtype, a wrong shape, ``step``
before ``reset`` -- raises one clear error, at no cost the env benchmark can see: the fused kernel
checks the actions in the loop it runs anyway; the ops kernel reads their min and max (one op) on
the CPU and, where it must not wait on the device (``dense``, i.e. CUDA), records a device flag
that the next call that reads the device anyway (``reset``, ``get_board``, ``state_dict``,
``render``) raises from.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlperf.device import resolve_device
from rlperf.env import floodfill, fused
from rlperf.env.fused import (DIR_ROW, DONE_ROW, DRAW_ROWS, EP_LEN_ROW, EP_RETURN_ROW, EP_SCORE_ROW, FINAL_LEN_ROW,
                              FINAL_OBS, FINAL_RETURN_ROW, FINAL_SCORE_ROW, FLAG_ROWS, FLOAT_ROWS, FRUIT_DRAW, FRUIT_ROW,
                              HEAD_ROW, HUNGRY_ROW, LENGTH_ROW, PTR_ROW, RESET_FRUIT_DRAW, REWARD_ROW, START_DRAW,
                              OBS_SLOTS, STATE_ROWS, TERMINATED_ROW, TRUNCATED_ROW)
from rlperf.env import single
from rlperf.env.single import render_board
import itertools
from rlperf.errors import ConfigError, InvalidActionError, ResetNeededError

# Absolute directions: up, right, down, left as (row, col) deltas.
DIRECTION_DELTAS = ((-1, 0), (0, 1), (1, 0), (0, -1))
# Relative action -> change of heading: straight, turn right, turn left.
ACTION_TURNS = (0, 1, 3)
N_ACTIONS = len(ACTION_TURNS)
OBS_MODES = ("features", "grid")
FLOOD_FILL_MODES = ("off", "bfs", "tensor")
KERNELS = ("auto", "ops", "fused")
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


def resolve_kernel(kernel: str, device: torch.device, flood_fill: str = "off", size: int = 10) -> tuple[str, str]:
    """The kernel that runs for ``kernel`` (``auto``, ``ops`` or ``fused``) on ``device``, and why.

    ``auto`` takes ``fused`` wherever it can run and ``ops`` elsewhere; an explicit ``fused`` that
    cannot run is a :class:`ConfigError`. Compiling (or loading) the fused kernel happens here, once
    per process, so a numba that imports but cannot build is caught before the first step.
    """
    if kernel not in KERNELS:
        raise ConfigError(f"env.kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel == "ops":
        return "ops", "env.kernel=ops (the tensor-operator reference)"
    if size > fused.MAX_SIZE:
        why = f"the fused kernel takes boards up to {fused.MAX_SIZE} wide, and size is {size}"
    elif flood_fill == "bfs":
        why = "env.flood_fill=bfs is the per-board Python reference, which only the ops kernel calls"
    elif device.type == "cuda":
        from rlperf.env import fused_cuda

        seconds, cuda_failure = fused_cuda.compile_kernel(device)
        if cuda_failure is None:
            source = "env.kernel=fused" if kernel == "fused" else "auto: numba's CUDA target is available"
            return "fused", f"{source} (numba {fused.numba.__version__}, CUDA, compiled in {seconds:.2f} s)"
        why = cuda_failure
    elif device.type != "cpu":
        why = f"the fused kernel runs on the CPU and CUDA, and the device is {device}"
    else:
        threads = torch.get_num_threads()
        failure: str | None
        try:
            seconds, failure = fused.compile_kernel()
        finally:
            # numba's first parallel launch sets the OpenMP thread count it shares with torch.
            torch.set_num_threads(threads)
        if failure is None:
            source = "env.kernel=fused" if kernel == "fused" else "auto: numba is available on the CPU"
            return "fused", f"{source} (numba {fused.numba.__version__}, compiled or loaded in {seconds:.2f} s)"
        why = failure
    if kernel == "fused":
        hint = "pip install numba, or use env.kernel=ops" if "numba" in why else "use env.kernel=ops or auto"
        raise ConfigError(f"env.kernel=fused cannot run: {why}", hint=hint)
    return "ops", f"auto: {why}"


class VectorSnake(VectorEnv):
    """``num_envs`` Snake boards stepped at once on ``device`` (Gymnasium 1.x ``VectorEnv``).

    Args:
        num_envs: number of boards.
        size: board side (>= 4).
        obs: ``"features"`` (11 floats, 14 with flood fill) or ``"grid"`` (3 x size x size planes).
        flood_fill: ``"off"``, ``"bfs"`` (Python BFS per board on the CPU, the slow reference) or
            ``"tensor"`` (batched on the device; inside the kernel with ``kernel="fused"``).
        initial_length: snake length at the start of an episode.
        hunger: steps without a fruit before truncation (default ``size * size``).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        render_mode: ``None``, ``"ansi"`` (board 0 as text) or ``"rgb_array"`` (every board as an
            ``(H, W, 3)`` uint8 image, a tuple of ``num_envs``, as Gymnasium's vector envs render).
        copy: return new tensors that are the caller's (default), or the env's own buffers, valid until
            the next step (``False``: for a trainer that reads each step's results before the next
            step; see the module docstring).
        kernel: ``"auto"`` (default: ``fused`` where it can run), ``"ops"`` or ``"fused"``; see the
            module docstring. :attr:`kernel` and :attr:`kernel_reason` say which runs and why.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 10, "autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012 (gymnasium's API)
    # Also as an attribute: TorchRL's GymWrapper reads it there.
    autoreset_mode = AutoresetMode.SAME_STEP

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
        kernel: str = "auto",
        copy: bool = True,
    ) -> None:
        _check_arguments(num_envs, size, obs, flood_fill, initial_length, hunger)
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ConfigError(f"render_mode must be None, 'ansi' or 'rgb_array', got {render_mode!r}")
        if max_episode_steps is not None:
            raise ValueError("max_episode_steps is not supported by VectorSnake; use hunger=")
        self.device = resolve_device(device)
        self.kernel, self.kernel_reason = resolve_kernel(kernel, self.device, flood_fill, size)
        self.num_envs = num_envs
        self.size = size
        self.obs_mode = obs
        self.flood_fill = flood_fill
        self.initial_length = initial_length
        self.hunger = hunger if hunger is not None else size * size
        self.render_mode = render_mode
        self.copy = bool(copy)
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
        self._needs_reset = True
        self._bad_actions = torch.zeros((), dtype=torch.bool, device=self.device)  # the dense path's deferred check
        self._cuda_launch: Any = None  # the fused kernel's CUDA build, bound to this env's tensors
        if self.kernel == "fused":
            self._bind_fused()

    # ------------------------------------------------------------------ setup
    def _allocate(self, obs_shape: tuple[int, ...]) -> None:
        """Every tensor a step reads or writes, once: the board's lookup tables, the state rows and the
        observation and output buffers."""
        self._build_tables()
        self._allocate_state()
        self._allocate_buffers(obs_shape)

    def _build_tables(self) -> None:
        """The board's constant lookup tables (neighbours, turns, row/column of each cell)."""
        c, s = self.cells, self.size
        i64: dict[str, Any] = {"dtype": torch.int64, "device": self.device}
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

    def _allocate_state(self) -> None:
        """The boards' state."""
        n, c, dev = self.num_envs, self.cells, self.device
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        # The state both kernels share (layout in rlperf.env.fused): every per-board counter is a
        # row of one tensor, so the fused kernel gets it as one array and the ops kernel as views.
        # Both update it in place: the fused kernel's numpy views must stay valid.
        self._gen = torch.Generator(device=dev)
        self._occ = torch.zeros((n, c + 1), dtype=torch.bool, device=dev)  # last column: the wall
        self._ring = torch.zeros((n, c), **i64)  # body cells, head at _head_ptr
        self._state = torch.zeros((STATE_ROWS, n), **i64)
        self._head_ptr = self._state[PTR_ROW]
        self._length = self._state[LENGTH_ROW]
        self._head = self._state[HEAD_ROW]
        self._dir = self._state[DIR_ROW]
        self._fruit = self._state[FRUIT_ROW]
        self._hungry_for = self._state[HUNGRY_ROW]  # steps since the last fruit
        self._ep_len = self._state[EP_LEN_ROW]
        self._ep_score = self._state[EP_SCORE_ROW]
        self._final_len = self._state[FINAL_LEN_ROW]
        self._final_score = self._state[FINAL_SCORE_ROW]
        self._floats = torch.zeros((FLOAT_ROWS, n), dtype=torch.float32, device=dev)
        self._ep_return = self._floats[EP_RETURN_ROW]
        self._final_return = self._floats[FINAL_RETURN_ROW]
        self._rewards = self._floats[REWARD_ROW]
        self._flags = torch.zeros((FLAG_ROWS, n), dtype=torch.bool, device=dev)
        self._terminated = self._flags[TERMINATED_ROW]
        self._truncated = self._flags[TRUNCATED_ROW]
        self._done = self._flags[DONE_ROW]

    def _allocate_buffers(self, obs_shape: tuple[int, ...]) -> None:
        """The observation buffers, the random draws, and what copy=True clones a step's results from."""
        n, dev = self.num_envs, self.device
        # Two alternating observation buffers and final_obs.
        self._obs_all = torch.zeros((3, n, *obs_shape), dtype=torch.float32, device=dev)
        self._obs = [self._obs_all[slot] for slot in OBS_SLOTS]
        self._final_obs = self._obs_all[FINAL_OBS]
        self._obs_index = 0
        # copy=True: the fused kernel wrote the last step's observation only into the returned tensor.
        self._obs_behind = False
        self._draws = torch.zeros((DRAW_ROWS, n), dtype=torch.float64, device=dev)
        self._all = torch.ones(n, dtype=torch.bool, device=dev)
        self._actions_shape = (n,)
        # copy=True clones a step's results from these, adjacent rows each: one clone per dtype.
        # Slot 0 is where copy=True observes (see _out_index), so [obs, final_obs] are adjacent too.
        self._pair = self._obs_all[:FINAL_OBS + 1]
        self._pair_shapes = ((2, n, *obs_shape), (2, n, math.prod(obs_shape)))  # returned, as the kernel writes it
        self._final_counters = self._state[FINAL_LEN_ROW:FINAL_SCORE_ROW + 1]  # steps, score
        self._final_floats = self._floats[FINAL_RETURN_ROW:REWARD_ROW + 1]  # return, reward
        self._key = np.uint64(0)  # the fused kernel's stream: seed key and step counter
        self._counter = 0

    def _bind_fused(self) -> None:
        """Numpy views of the state for the fused kernel (zero-copy: they share the tensors' memory);
        on CUDA, the bound launch of the CUDA build (numba views of the same tensors)."""
        n = self.num_envs
        if self.device.type == "cuda":
            from rlperf.env import fused_cuda

            self._cuda_actions = torch.zeros(n, dtype=torch.int64, device=self.device)
            self._cuda_launch = fused_cuda.Launcher(
                self._occ, self._ring, self._state, self._floats, self._flags, self._obs_all, self._draws,
                self._cuda_actions, self._bad_actions, self.size, self.initial_length, self.hunger,
                self.obs_mode == "grid", self.flood_fill != "off")
            return
        # The observations are passed apart: with copy=True a step's go straight into new tensors.
        self._fused_state = (self._occ.numpy(), self._ring.numpy(), self._state.numpy(), self._floats.numpy(),
                             self._flags.numpy())
        self._fused_obs = self._obs_all.numpy().reshape(3, n, -1)
        self._fused_rest = (fused.cell_table(self.size), fused.scratch(n, self.size), self.size, self.initial_length,
                            self.hunger, self.obs_mode == "grid", self.flood_fill != "off")
        self._no_draws = np.zeros((DRAW_ROWS, 1), dtype=np.float64)
        # The kernel's threads follow torch's (run.threads sets both before the env is built).
        torch_threads = torch.get_num_threads()
        threads = max(1, min(torch_threads, fused.numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
        self._fused_driver = fused.step_boards
        try:
            fused.numba.set_num_threads(threads)
            # Compiled or loaded only where it runs: a one-thread run never pays for the threaded driver.
            if fused.parallel_pays(n, self.flood_fill != "off", threads) and fused.compile_kernel(parallel=True)[1] is None:
                self._fused_driver = fused.step_boards_parallel  # else the serial one: the same steps
        finally:  # numba's thread pool, launched here, sets the OpenMP thread count it shares with torch
            torch.set_num_threads(torch_threads)

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
        """Start a new episode on every board; ``seed`` seeds the env's random draws."""
        self._raise_deferred()
        if seed is not None:
            if not isinstance(seed, (int, np.integer)):
                raise ValueError(f"seed must be an int (one generator drives all boards), got {type(seed).__name__}")
            self._seed(int(seed))
        elif not self._seeded:
            self._seed(int(np.random.SeedSequence().entropy) % (2**63))  # type: ignore[arg-type]
        return self._reset(None)

    def reset_with_draws(self, draws: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, dict]:
        """``reset()`` with explicit draws ``(3, num_envs)`` in [0, 1) instead of the env's own (tests)."""
        return self._reset(self._checked_draws(draws))

    def step(self, actions: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Advance every board by one move; finished boards restart in the same step."""
        return self._step(actions, None)

    def step_with_draws(self, actions: torch.Tensor | np.ndarray, draws: torch.Tensor | np.ndarray
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """``step()`` with explicit draws ``(3, num_envs)`` in [0, 1): row 0 the fruit after eating,
        row 1 a new episode's start, row 2 its fruit. Both kernels consume them the same way, so
        the same draws give the same next state bit for bit (the exactness tests)."""
        return self._step(actions, self._checked_draws(draws))

    def _seed(self, seed: int) -> None:
        self._gen.manual_seed(seed)
        self._key = fused.seed_key(seed)
        self._counter = 0
        self._seeded = True

    def _checked_draws(self, draws: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        if tuple(draws.shape) != (DRAW_ROWS, self.num_envs):
            raise ValueError(f"draws must have shape ({DRAW_ROWS}, {self.num_envs}), got {tuple(draws.shape)}")
        if self.kernel == "fused" and self.device.type == "cpu":
            array = draws.cpu().numpy() if isinstance(draws, torch.Tensor) else draws
            return np.ascontiguousarray(array, dtype=np.float64)
        return torch.as_tensor(draws, dtype=torch.float64, device=self.device)

    def _out_index(self) -> int:
        """The observation buffer a reset or step writes: the two alternate for copy=False's
        ``obs = next_obs`` hand-offs; copy=True returns new tensors, so it always takes slot 0 (its
        ``final_obs`` next to it in slot 1: one block to clone, laid out as the fused kernel writes
        a new pair)."""
        return 0 if self.copy else self._obs_index ^ 1

    def _reset(self, draws: Any) -> tuple[torch.Tensor, dict]:
        out_index = self._out_index()
        self._obs_behind = False
        if self.kernel == "fused" and self._cuda_launch is not None:
            self._cuda_step(None, draws, True, OBS_SLOTS[out_index], None)
        elif self.kernel == "fused":
            injected = draws is not None
            self._fused_step(self._no_actions(), draws if injected else self._no_draws, injected, True, OBS_SLOTS[out_index],
                             self._fused_obs)
        else:
            u = self._draws if draws is None else draws
            if draws is None:
                torch.rand(u.shape, generator=self._gen, dtype=torch.float64, device=self.device, out=u)
            self._reset_boards(self._all, True, u[START_DRAW])
            self._respawn_fruit(self._all, True, u[RESET_FRUIT_DRAW])
            self._observe(self._obs[out_index])
        self._obs_index = out_index
        self._counter += 1
        self._needs_reset = False
        obs = self._obs[out_index]
        return (obs.clone() if self.copy else obs), {}

    def _step(
        self, actions: torch.Tensor | np.ndarray, draws: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        if self._needs_reset:
            raise ResetNeededError("VectorSnake.step() was called before reset()", hint="call env.reset(seed=...) first")
        out_index = self._out_index()
        pair = None  # copy=True, fused kernel: the new observation and final_obs it writes into
        if self.kernel == "fused" and self._cuda_launch is not None:
            if self.copy:
                pair = torch.empty(self._pair_shapes[0], device=self.device)
            self._cuda_step(actions, draws, False, OBS_SLOTS[out_index], pair)
            self._obs_behind = self.copy
        elif self.kernel == "fused":
            injected = draws is not None
            obs = self._fused_obs
            if self.copy:
                pair = torch.empty(self._pair_shapes[0], device=self.device)
                obs = pair.numpy().reshape(self._pair_shapes[1])
            self._fused_step(self._actions_array(actions), draws if injected else self._no_draws, injected, False,
                             OBS_SLOTS[out_index], obs)
            self._obs_behind = self.copy
        else:
            self._step_ops(self._checked_actions(actions), draws, self._obs[out_index])
        self._obs_index = out_index
        self._counter += 1
        return self._results(out_index, pair)

    def _results(self, out_index: int, pair: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """What ``step`` returns: views of the env's buffers, or (``copy=True``) new tensors: the
        fused kernel's ``pair`` (observation, ``final_obs``), or clones of the env's observations,
        and clones of its returned rows."""
        if not self.copy:  # the row views made once in _allocate, no tensor op per step
            done = self._done
            infos = {
                "final_obs": self._final_obs,
                "_final_obs": done,
                "final_info": {"score": self._final_score, "steps": self._final_len, "return": self._final_return},
                "_final_info": done,
            }
            return self._obs[out_index], self._rewards, self._terminated, self._truncated, infos
        obs, final_obs = (self._pair.clone() if pair is None else pair).unbind()
        steps, score = self._final_counters.clone().unbind()
        final_return, reward = self._final_floats.clone().unbind()
        terminated, truncated, done = self._flags.clone().unbind()
        infos = {
            "final_obs": final_obs,
            "_final_obs": done,
            "final_info": {"score": score, "steps": steps, "return": final_return},
            "_final_info": done,
        }
        return obs, reward, terminated, truncated, infos

    def _fused_step(self, actions: np.ndarray, draws: np.ndarray, injected: bool, reset_all: bool, out_slot: int,
                    obs: np.ndarray) -> None:
        bad = self._fused_driver(actions, draws, injected, self._key, self._counter, reset_all, out_slot,
                                *self._fused_state, obs, *self._fused_rest)
        if bad:
            raise self._invalid_action(actions[bad - 1], bad - 1)

    def _cuda_step(self, actions: Any, draws: torch.Tensor | None, reset_all: bool, out_slot: int,
                   pair: torch.Tensor | None) -> None:
        """The CUDA build's step: actions and injected draws copied into the bound device buffers
        (no host sync; an invalid action is clamped and raised at the next read, as on the dense path)."""
        if actions is not None:
            self._cuda_actions.copy_(self._actions_tensor(actions))
        if draws is not None and draws is not self._draws:
            self._draws.copy_(draws)
        self._cuda_launch(draws is not None, self._key, self._counter, reset_all, out_slot, pair)

    def _no_actions(self) -> np.ndarray:
        return np.zeros(self.num_envs, dtype=np.int64)

    def _actions_array(self, actions: Any) -> np.ndarray:
        """The actions as a C-contiguous int64 numpy array of ``num_envs`` (no copy when they are one)."""
        # The common cases first, with the cheapest checks: this runs every step.
        if type(actions) is torch.Tensor and actions.dtype is torch.int64 and not actions.is_cuda:
            array = actions.numpy()
        elif type(actions) is np.ndarray and actions.dtype == np.int64:
            array = actions
        else:
            array = self._actions_tensor(actions).cpu().numpy()
        if array.shape != self._actions_shape:
            raise InvalidActionError(f"actions must have shape {self._actions_shape}, got {array.shape}")
        return np.ascontiguousarray(array)

    def _actions_tensor(self, actions: Any) -> torch.Tensor:
        """The actions as an int64 tensor on the env's device; a dtype that is not an integer is refused."""
        actions = torch.as_tensor(actions, device=self.device)
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise InvalidActionError(f"actions must be integers 0, 1 or 2, got dtype {actions.dtype}")
        if actions.shape != self._actions_shape:
            raise InvalidActionError(f"actions must have shape {self._actions_shape}, got {tuple(actions.shape)}")
        return actions.long()

    def _checked_actions(self, actions: Any) -> torch.Tensor:
        """The ops kernel's actions, their values checked: on the CPU by their min and max (one op and
        a free host read); on the dense path (CUDA) by a device flag, raised at the next sync."""
        actions = self._actions_tensor(actions)
        if self.dense:
            torch.logical_or(self._bad_actions, ((actions < 0) | (actions > 2)).any(), out=self._bad_actions)
            return actions.clamp(0, 2)  # a bad value must not index out of bounds before it is raised
        low, high = torch.aminmax(actions)
        if low < 0 or high > 2:
            board = int(((actions < 0) | (actions > 2)).nonzero()[0])
            raise self._invalid_action(actions[board], board)
        return actions

    def _raise_deferred(self) -> None:
        """Raise an invalid action the dense path recorded on the device (this reads the device)."""
        if self.dense and bool(self._bad_actions):
            self._bad_actions.zero_()
            raise InvalidActionError("an action outside 0 (straight), 1 (right) and 2 (left) was passed to step() "
                                     "(detected on the device without a sync; the step ran with it clamped)")

    def _invalid_action(self, value: Any, board: int) -> InvalidActionError:
        return InvalidActionError(f"action {int(value)} for board {board} is not 0 (straight), 1 (right) or 2 (left)")

    def _step_ops(self, actions: torch.Tensor, draws: torch.Tensor | None, out: torch.Tensor) -> None:
        """The ops kernel: one tensor operator per rule, over all boards."""
        c = self.cells
        if draws is None:
            draws = torch.rand(self._draws.shape, generator=self._gen, dtype=torch.float64, device=self.device,
                               out=self._draws)

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
        torch.where(alive, target, self._head, out=self._head)
        torch.where(alive, direction, self._dir, out=self._dir)
        self._occ.scatter_(1, self._head.unsqueeze(1), True)
        torch.where(alive, (self._head_ptr + 1) % c, self._head_ptr, out=self._head_ptr)
        self._ring.scatter_(1, self._head_ptr.unsqueeze(1), self._head.unsqueeze(1))
        self._length += eat
        self._hungry_for.add_(1).masked_fill_(eat, 0)

        torch.sub(eat.float(), dead.float(), out=self._rewards)
        win = eat & (self._length == c)
        torch.bitwise_or(dead, win, out=self._terminated)
        torch.bitwise_and(~self._terminated, self._hungry_for >= self.hunger, out=self._truncated)
        done = torch.bitwise_or(self._terminated, self._truncated, out=self._done)
        self._ep_len += 1
        self._ep_score += eat
        self._ep_return += self._rewards

        # Final observation of every board (the next observation where the episode goes on).
        self._respawn_fruit(eat & ~win, self.dense, draws[FRUIT_DRAW])
        self._observe(self._final_obs)
        self._final_score.copy_(self._ep_score)
        self._final_len.copy_(self._ep_len)
        self._final_return.copy_(self._ep_return)

        # Same-step autoreset.
        out.copy_(self._final_obs)
        if self.dense:
            self._reset_boards(done, True, draws[START_DRAW])
            self._respawn_fruit(done, True, draws[RESET_FRUIT_DRAW])
            self._observe(out)
        else:
            index = done.nonzero().squeeze(1)
            if index.numel():
                mask = torch.zeros_like(done).index_fill_(0, index, True)
                self._reset_boards(mask, False, draws[START_DRAW])
                self._respawn_fruit(mask, False, draws[RESET_FRUIT_DRAW])
                self._observe(out, index)

    def render(self) -> str | tuple[np.ndarray, ...] | None:  # type: ignore[override]
        """Board 0 as text (``ansi``), or every board as an ``(H, W, 3)`` uint8 image (``rgb_array``,
        a tuple of ``num_envs`` frames: what Gymnasium's vector ``RecordVideo`` takes)."""
        self._raise_deferred()
        if self.render_mode == "ansi":
            return self.render_text(0)
        if self.render_mode == "rgb_array":
            return tuple(self.render_frames())
        return None

    def render_frames(self) -> np.ndarray:
        """Every board as an image, ``(num_envs, H, W, 3)`` uint8 (``single.render_frames`` of each board)."""
        c, s = self.cells, self.size
        kinds = self._occ[:, :c].to(torch.uint8) * single.BODY
        kinds.scatter_(1, self._fruit.unsqueeze(1), single.FRUIT)
        kinds.scatter_(1, self._head.unsqueeze(1), single.HEAD)  # after the fruit: a full board parks it there
        return single.render_frames(kinds.view(-1, s, s).cpu().numpy())

    def render_text(self, index: int = 0) -> str:
        """Board ``index`` as text: ``#`` walls, ``o`` body, ``^>v<`` head, ``*`` fruit."""
        board = self.get_board(index)
        return render_board(self.size, board["body"], board["direction"], board["fruit"])

    # ------------------------------------------------------------------ state access (tests, rendering)
    def get_board(self, index: int) -> dict[str, Any]:
        """One board's state as plain Python values: body (head first), direction, fruit, counters."""
        self._raise_deferred()
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
        self._obs_behind = False
        self._observe(self._obs[self._obs_index])
        self._needs_reset = False

    @property
    def observations(self) -> torch.Tensor:
        """The most recent observation batch (what the last reset/step returned), in the env's own
        buffer: the next step changes it."""
        if self._obs_behind:  # the state determines it: observe it again rather than read the caller's
            self._observe(self._obs[self._obs_index])
            self._obs_behind = False
        return self._obs[self._obs_index]

    _STATE_NAMES = ("_occ", "_ring", "_head_ptr", "_length", "_head", "_dir", "_fruit", "_hungry_for",
                    "_ep_len", "_ep_score", "_ep_return")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this env is (for checkpoints)."""
        self._raise_deferred()
        state = {name: getattr(self, name).cpu().clone() for name in self._STATE_NAMES}
        state["obs"] = self.observations.cpu().clone()
        state["generator"] = self._gen.get_state()
        state["stream"] = (int(self._key), self._counter)  # the fused kernel's draws
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
        self._obs_behind = False
        self._obs[0].copy_(state["obs"].to(self.device))
        self._gen.set_state(state["generator"])
        key, self._counter = state.get("stream", (0, 0))
        self._key = np.uint64(key)
        self._seeded = True
        self._needs_reset = False

    # ------------------------------------------------------------------ internals (the ops kernel)
    def _spawn(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Start positions picked by the draws ``u``: heading, head cell and body cells (head first).

        The ``4 * (size - length + 1) * size`` starts are ordered by heading, then by ``along`` (the
        head's distance along its heading from the far wall: room for the body behind it), then by
        ``across``, exactly as ``fused.start_episode`` orders them.
        """
        s, length = self.size, self.initial_length
        per_heading = (s - length + 1) * s
        j = _pick(u, 4 * per_heading)
        direction = j // per_heading
        along = (j % per_heading) // s
        across = j % s
        # Heading up: the body hangs below the head, so the head row is in [0, s - length].
        row = torch.where(direction == 0, along, torch.where(direction == 2, s - 1 - along, across))
        col = torch.where(direction == 3, along, torch.where(direction == 1, s - 1 - along, across))
        delta = self._delta[direction]  # (n, 2)
        rows = row.unsqueeze(1) - self._body_steps * delta[:, :1]
        cols = col.unsqueeze(1) - self._body_steps * delta[:, 1:]
        body = rows * s + cols  # (n, length), head first
        return direction, body[:, 0], body

    def _reset_boards(self, mask: torch.Tensor, dense: bool, u: torch.Tensor) -> None:
        """Start new episodes on the boards in ``mask``, at the starts their draws ``u`` pick."""
        length, c = self.initial_length, self.cells
        if dense:
            direction, head, body = self._spawn(u)
            m = mask.unsqueeze(1)
            self._occ &= ~m
            self._occ[:, c] = True
            self._occ.scatter_(1, body, m | self._occ.gather(1, body))
            self._ring[:, :length] = torch.where(m, body.flip(1), self._ring[:, :length])
            torch.where(mask, direction, self._dir, out=self._dir)
            torch.where(mask, head, self._head, out=self._head)
            self._head_ptr.masked_fill_(mask, length - 1)
            self._length.masked_fill_(mask, length)
            for counter in (self._hungry_for, self._ep_len, self._ep_score, self._ep_return):
                counter.masked_fill_(mask, 0)
            return
        index = mask.nonzero().squeeze(1)
        direction, head, body = self._spawn(u[index])
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

    def _respawn_fruit(self, mask: torch.Tensor, dense: bool, u: torch.Tensor) -> None:
        """Put a fruit on each board in ``mask``: the free cell its draw ``u`` picks, in row-major order."""
        if dense:
            torch.where(mask, self._kth_free(self._occ, self._length, u), self._fruit, out=self._fruit)
            return
        index = mask.nonzero().squeeze(1)
        if index.numel() == 0:
            return
        self._fruit[index] = self._kth_free(self._occ[index], self._length[index], u[index])

    def _kth_free(self, occ: torch.Tensor, length: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The free cell each draw picks: the k-th (from 0) cell not held by the body, k = pick(u, free)."""
        c = self.cells
        k = _pick(u, c - length)
        rank = (~occ[:, :c]).cumsum(1)  # free cells up to and including each cell
        return (rank <= k.unsqueeze(1)).sum(1)  # cells before the k-th free one: its index

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


def _pick(u: torch.Tensor, m: torch.Tensor | int) -> torch.Tensor:
    """``floor(u * m)``, at most ``m - 1``: which of ``m`` candidates a draw picks (as ``fused.pick``)."""
    k = (u * m).long()
    if isinstance(m, int):  # a Python bound: no tensor made from it (on CUDA that is a host-to-device copy)
        return k.clamp_(max=m - 1)
    return torch.minimum(k, m - 1)
