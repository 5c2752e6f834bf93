"""Multi-party, relation-aware support dialogue (docs/dialogue.md): RESCUE's session format and its six tasks
(`load_sessions`, `instances`, `parse`, `score`, pluggable judges), a couple-therapy simulator in the same
format with an exact optimum (`CoupleSim`, `solve`, `simulate_session`), its interactive mode as a run's task
(`task.name = "dialogue"`: `TherapyEnv`, `DialogueTask`), and the checks that the simulator tests what it
claims (`relation_check`, `leakage`)."""

from rlax_post.envs.dialogue._audit import leakage
from rlax_post.envs.dialogue._audit import naive_bayes
from rlax_post.envs.dialogue._audit import relation_check
from rlax_post.envs.dialogue._bench import Instance
from rlax_post.envs.dialogue._bench import instances
from rlax_post.envs.dialogue._bench import parse
from rlax_post.envs.dialogue._bench import render_row
from rlax_post.envs.dialogue._bench import TASKS
from rlax_post.envs.dialogue._format import COUPLE_PATTERNS
from rlax_post.envs.dialogue._format import COUPLE_STRATEGIES
from rlax_post.envs.dialogue._format import dump_session
from rlax_post.envs.dialogue._format import Emotion
from rlax_post.envs.dialogue._format import FAMILY_PATTERNS
from rlax_post.envs.dialogue._format import FAMILY_STRATEGIES
from rlax_post.envs.dialogue._format import load_session
from rlax_post.envs.dialogue._format import load_sessions
from rlax_post.envs.dialogue._format import parse_session
from rlax_post.envs.dialogue._format import Row
from rlax_post.envs.dialogue._format import Session
from rlax_post.envs.dialogue._format import session_to_json
from rlax_post.envs.dialogue._format import Strategy
from rlax_post.envs.dialogue._format import SupportMove
from rlax_post.envs.dialogue._format import THERAPIST
from rlax_post.envs.dialogue._format import Viewpoint
from rlax_post.envs.dialogue._harness import demo_row
from rlax_post.envs.dialogue._harness import prompt_ids
from rlax_post.envs.dialogue._harness import prompt_text
from rlax_post.envs.dialogue._metrics import emotion_judge
from rlax_post.envs.dialogue._metrics import judges_of
from rlax_post.envs.dialogue._metrics import score
from rlax_post.envs.dialogue._metrics import viewpoint_judge
from rlax_post.envs.dialogue._render import parse_message
from rlax_post.envs.dialogue._render import therapist_message
from rlax_post.envs.dialogue._sim import Action
from rlax_post.envs.dialogue._sim import baseline_action
from rlax_post.envs.dialogue._sim import BOTH
from rlax_post.envs.dialogue._sim import CoupleSim
from rlax_post.envs.dialogue._sim import pattern_of
from rlax_post.envs.dialogue._sim import policy_return
from rlax_post.envs.dialogue._sim import random_return
from rlax_post.envs.dialogue._sim import solve
from rlax_post.envs.dialogue._sim import State
from rlax_post.envs.dialogue._sim import STRATEGIES
from rlax_post.envs.dialogue._task import DialogueTask
from rlax_post.envs.dialogue._task import make_dialogue_task
from rlax_post.envs.dialogue._task import NAME
from rlax_post.envs.dialogue._task import PROMPT
from rlax_post.envs.dialogue._world import NAME_PAIRS
from rlax_post.envs.dialogue._world import responders
from rlax_post.envs.dialogue._world import simulate_session
from rlax_post.envs.dialogue._world import TherapyEnv

__all__ = [
    "leakage", "naive_bayes", "relation_check", "Instance", "instances", "parse", "render_row", "TASKS",
    "COUPLE_PATTERNS", "COUPLE_STRATEGIES", "dump_session", "Emotion", "FAMILY_PATTERNS", "FAMILY_STRATEGIES",
    "load_session", "load_sessions", "parse_session", "Row", "Session", "session_to_json", "Strategy", "SupportMove",
    "THERAPIST", "Viewpoint", "demo_row", "prompt_ids", "prompt_text", "emotion_judge", "judges_of", "score",
    "viewpoint_judge", "parse_message", "therapist_message", "Action", "baseline_action", "BOTH", "CoupleSim",
    "pattern_of", "policy_return", "random_return", "solve", "State", "STRATEGIES", "DialogueTask",
    "make_dialogue_task", "NAME", "PROMPT", "NAME_PAIRS", "responders", "simulate_session", "TherapyEnv",
]
