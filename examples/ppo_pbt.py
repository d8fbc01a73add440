"""PBT (or PB2) tuning PPO from stable-baselines3 on gymnasium's Pendulum-v1.

Ray's ``pbt_ppo_example.py`` tunes RLlib's PPO; this is the same idea on a task a
2-core machine can train: swinging a pendulum up and holding it, where PPO's defaults
(gamma 0.99, lr 3e-4) do not get there in 100k steps. PBT mutates the learning rate,
clip range, entropy coefficient, discount, GAE lambda, minibatch size and epochs per
update; an exploited member loads the better member's saved model (``PPO.save``/
``PPO.load``: policy, value function and optimizer) and goes on with the perturbed
settings. Each training iteration is one PPO rollout of 4 x 1024 steps; the metric is
SB3's mean return of the last 100 episodes. At the end the best member's checkpoint is
evaluated on 10 fresh episodes with its deterministic policy, beside the RL Zoo's
published PPO score for Pendulum-v1 (-172 +- 104 after 100k steps, with hand-tuned
settings).

    python examples/ppo_pbt.py --smoke-test
    python examples/ppo_pbt.py                      # 4 members x 100k steps, ~3 min here
    python examples/ppo_pbt.py --scheduler pb2 --num-samples 4

Needs the ``rl`` extra (``pip install 'popflow[rl]'``: stable-baselines3, gymnasium).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import Any

from popflow import tune
from popflow.infra.storage.options_cli import add_storage_arguments, storage_options_from_args
from popflow.schedulers import PB2, PopulationBasedTraining

ENV_ID = "Pendulum-v1"
#: The RL Zoo's PPO on Pendulum-v1 (its benchmark.md: 100k steps, 10 episodes deterministic)
REFERENCE = (-172.225, 104.159)
MODEL_FILE = "ppo.zip"
#: The settings PBT and PB2 change, with their ranges (PB2 takes the continuous ones)
BOUNDS = {
    "learning_rate": (1e-4, 3e-3),
    "clip_range": (0.1, 0.3),
    "gamma": (0.85, 0.999),
    "gae_lambda": (0.8, 1.0),
}
CHOICES = {"batch_size": [32, 64, 128, 256], "n_epochs": [5, 10, 20]}


def hyperparameters(config: dict[str, Any]) -> dict[str, Any]:
    """The PPO arguments a config sets (what PBT perturbs, plus the fixed rollout size)."""
    keys = [*BOUNDS, *CHOICES, "ent_coef", "n_steps"]
    return {k: config[k] for k in keys}


class PPOTrainable(tune.Trainable):
    """One population member: a PPO agent on ``n_envs`` copies of the task."""

    def setup(self, config: dict[str, Any]) -> None:
        import torch
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_vec_env

        torch.set_num_threads(1)  # one core per member: the population fills the machine
        self.env = make_vec_env(ENV_ID, n_envs=config["n_envs"], seed=config["seed"])
        self.model = PPO(
            "MlpPolicy",
            self.env,
            use_sde=True,  # state-dependent exploration, as the RL Zoo's Pendulum settings
            sde_sample_freq=4,
            seed=config["seed"],
            device="cpu",
            verbose=0,
            **hyperparameters(config),
        )

    def step(self) -> dict[str, Any]:
        steps = self.config["n_steps"] * self.config["n_envs"]
        self.model.learn(steps, reset_num_timesteps=False)
        returns = [episode["r"] for episode in self.model.ep_info_buffer]
        return {
            "episode_reward_mean": sum(returns) / len(returns) if returns else float("nan"),
            "timesteps_total": self.model.num_timesteps,
        }

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.model.save(os.path.join(checkpoint_dir, MODEL_FILE))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self._load(os.path.join(checkpoint_dir, MODEL_FILE), self.config)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        # PBT changed the settings: SB3 rebuilds its schedules and rollout buffer on load,
        # so the model goes through an in-memory save with the new arguments
        buffer = io.BytesIO()
        self.model.save(buffer)
        buffer.seek(0)
        self._load(buffer, new_config)
        return True

    def _load(self, source: Any, config: dict[str, Any]) -> None:
        from stable_baselines3 import PPO

        self.model = PPO.load(source, env=self.env, device="cpu", **hyperparameters(config))


def evaluate(checkpoint: tune.Checkpoint, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and spread of the return of ``episodes`` deterministic episodes."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    with checkpoint.as_directory() as folder:
        model = PPO.load(os.path.join(folder, MODEL_FILE), device="cpu")
    env = make_vec_env(ENV_ID, n_envs=1, seed=seed + 10_000)  # episodes no member trained on
    mean, std = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=True)
    return float(mean), float(std)


def clip(config: dict[str, Any]) -> dict[str, Any]:
    """PBT's perturbations multiply by 0.8 or 1.2 and may leave a range (a discount above
    1): clamp them back, as Ray's ``pbt_ppo_example`` does with its ``explore``."""
    for key, (low, high) in BOUNDS.items():
        config[key] = min(max(config[key], low), high)
    config["ent_coef"] = min(max(config["ent_coef"], 0.0), 0.1)
    return config


def make_scheduler(name: str, interval: int, synch: bool = False) -> PopulationBasedTraining | PB2:
    """PBT or PB2 every ``interval`` iterations (``synch``: the population waits for each
    other at each interval, as benchmarks/search_quality.py runs them)."""
    if name == "pb2":
        return PB2(
            time_attr="training_iteration",
            perturbation_interval=interval,
            hyperparam_bounds={k: list(v) for k, v in BOUNDS.items()},
            synch=synch,
        )
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=interval,
        synch=synch,
        custom_explore_fn=clip,
        hyperparam_mutations={
            **{k: tune.uniform(*v) for k, v in BOUNDS.items()},
            "learning_rate": tune.loguniform(*BOUNDS["learning_rate"]),
            "ent_coef": tune.loguniform(1e-6, 1e-2),
            **CHOICES,
        },
    )


def param_space(args: argparse.Namespace) -> dict[str, Any]:
    space: dict[str, Any] = {k: tune.uniform(*v) for k, v in BOUNDS.items()}
    space["learning_rate"] = tune.loguniform(*BOUNDS["learning_rate"])
    space["ent_coef"] = tune.loguniform(1e-6, 1e-2)
    space.update({k: tune.choice(v) for k, v in CHOICES.items()})
    space.update(n_envs=args.n_envs, n_steps=args.n_steps, seed=tune.randint(0, 2**31 - 1))
    return space


def missing_extra() -> bool:
    try:
        import gymnasium  # noqa: F401
        import stable_baselines3  # noqa: F401
    except ImportError:
        return True
    return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scheduler", choices=["pbt", "pb2"], default="pbt")
    parser.add_argument("--num-samples", type=int, default=4, help="population size")
    parser.add_argument("--iterations", type=int, default=25, help="rollouts per member")
    parser.add_argument("--interval", type=int, default=4, help="iterations between exploits")
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--n-steps", type=int, default=1024, help="steps per env per rollout")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--synch",
        action="store_true",
        help="synchronous PBT/PB2: the members wait for each other at each interval "
        "(for more members than worker slots, and runs that repeat exactly)",
    )
    parser.add_argument("--storage", default="./results")
    parser.add_argument("--name", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smoke-test", action="store_true", help="2 members, 3 short rollouts each"
    )
    add_storage_arguments(parser)
    args = parser.parse_args(argv)
    if missing_extra():  # said before anything starts, not as a traceback from every worker
        sys.exit(
            "ppo_pbt.py needs popflow's rl extra (stable-baselines3, gymnasium): "
            "pip install 'popflow[rl]' (in a checkout: pip install -e '.[rl]')"
        )
    if args.smoke_test:
        args.num_samples, args.iterations, args.interval = 2, 3, 1
        args.n_envs, args.n_steps, args.eval_episodes = 1, 256, 1
    tuner = tune.Tuner(
        PPOTrainable,
        param_space=param_space(args),
        tune_config=tune.TuneConfig(
            metric="episode_reward_mean",
            mode="max",
            scheduler=make_scheduler(args.scheduler, args.interval, args.synch),
            num_samples=args.num_samples,
            seed=args.seed,
        ),
        run_config=tune.RunConfig(
            name=args.name or f"ppo_{args.scheduler}",
            storage_path=args.storage,
            storage_options=storage_options_from_args(args),
            stop={"training_iteration": args.iterations},
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_at_end=True),
        ),
    )
    results = tuner.fit()
    best = results.get_best_result()
    mean, std = evaluate(best.checkpoint, args.eval_episodes, args.seed)
    settings = ", ".join(f"{k}={best.config[k]:.4g}" for k in hyperparameters(best.config))
    print(
        f"best member: training return {best.metrics['episode_reward_mean']:.1f} after "
        f"{best.metrics['timesteps_total']} steps; {args.eval_episodes} evaluation episodes: "
        f"{mean:.1f} +- {std:.1f} (RL Zoo's PPO on {ENV_ID}: "
        f"{REFERENCE[0]:.1f} +- {REFERENCE[1]:.1f} after 100k steps)\n"
        f"its settings: {settings}"
    )


if __name__ == "__main__":
    main()
