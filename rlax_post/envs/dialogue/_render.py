"""Surface text of the couple simulator (`_sim`): what the clients and the therapist say, from templates.

Every client line is a function of the speaker's hidden stance and distress and a paraphrase variant: the
utterance says the stance (`UTTERANCES[stance][variant]`, the partner's name filled in), the tone of voice
says the distress (`TONES[d]`). Variants 0..2 of each stance are the training paraphrases, 3..4 held out
(`VARIANTS`): the simulator's held-out sessions and episodes use only those, so a policy that memorised the
training sentences meets new ones. The RESCUE fields a row carries beside the text (posture, face,
behaviour) are templates of the same hidden state.
"""

from __future__ import annotations

import re

from rlax_post.envs.dialogue import _sim

UTTERANCES = {
    "pursue": ("{p}, why won't you talk to me?", "I keep reaching out and {p} ignores me.",
               "we need to talk about this, {p}.", "{p} never lets me in.", "I just want {p} here with me."),
    "withdraw": ("I don't know. whatever.", "I'd rather not talk about it.", "there's no point, {p} won't hear it.",
                 "can we just drop it?", "I'm fine. leave it."),
    "attack": ("this is all your fault, {p}!", "{p} ruins everything.", "you are impossible, {p}.",
               "I'm sick of your excuses, {p}.", "how could you do this, {p}?"),
    "soften": ("I see I hurt you, {p}.", "I want us to work this out.", "maybe I was scared, not angry.",
               "I miss us, {p}.", "I'm ready to listen now."),
}
VARIANTS = {"train": (0, 1, 2), "heldout": (3, 4)}
TONES = ("relaxed", "calm", "tense", "upset", "overwhelmed")  # by distress level (max_distress = 4)
POSTURES = {"pursue": "leaning in", "withdraw": "turned away", "attack": "pointing", "soften": "open"}
FACES = ("smiling", "soft", "frowning", "tearful", "flushed")
BEHAVIOURS = {"pursue": "demanding", "withdraw": "stonewalling", "attack": "criticising", "soften": "acknowledging"}
VERBS = {"pursue": "pursues", "withdraw": "withdraws", "attack": "attacks", "soften": "softens"}
THERAPIST_SAYS = {
    "track": "what happens inside when this comes up?",
    "reframe": "maybe the anger is fear of losing each other.",
    "evoke": "what are you feeling right now?",
    "enact": "can you tell each other that directly?",
    "join": "I hear how hard this is.",
    "detach": "let's slow down and step back a moment.",
    "repair": "what would help mend this between you?",
    "counterbalance": "I want to hear from both of you.",
    "safeguard": "let's keep this safe: no blaming for now.",
    "goal_align": "what do you both want this to become?",
}
INTENTIONS = {
    "track": "follow the client's inner experience", "reframe": "recast the cycle as shared fear",
    "evoke": "bring the hidden emotion forward", "enact": "have the clients turn to each other",
    "join": "validate and ally with the client", "detach": "lower the heat of the exchange",
    "repair": "invite a repair attempt", "counterbalance": "balance attention across clients",
    "safeguard": "stop the escalation", "goal_align": "name the shared goal",
}


def tone(distress: int, max_distress: int) -> str:
  """The tone word of a distress level (scaled onto `TONES` when max_distress != 4)."""
  return TONES[int(round(distress * (len(TONES) - 1) / max_distress))]


def client_text(stance: str, partner: str, variant: int) -> str:
  return UTTERANCES[stance][variant].format(p=partner)


def client_line(name: str, stance: str, distress: int, partner: str, variant: int, max_distress: int) -> str:
  """One client line of an episode's observation: 'alex (tense): <utterance>'."""
  return f"{name} ({tone(distress, max_distress)}): {client_text(stance, partner, variant)}\n"


def therapist_message(names: tuple[str, str], action: _sim.Action) -> str:
  """The interactive mode's canonical therapist message: 'to <name>: <strategy>' or 'to both: <strategy>'."""
  who = "both" if action.target == _sim.BOTH else names[action.target]
  return f"to {who}: {action.strategy}"


def parse_message(message: str, names: tuple[str, str]) -> _sim.Action | None:
  """The action a therapist message means, or None: 'to <name>|both: <strategy>', optionally followed by the
  therapist's own words ('to sam: reframe. maybe the anger is fear.'; case and blanks ignored). The clients
  react to the target and the strategy; the words are the therapist's to choose (`message_words`)."""
  text = " ".join(message.lower().split())
  if not text.startswith("to ") or ":" not in text:
    return None
  who, _, rest = text[3:].partition(":")
  strategy = re.split(r"[\s.,;!?-]", rest.strip(), maxsplit=1)[0]
  targets = {names[0]: 0, names[1]: 1, "both": _sim.BOTH}
  if who.strip() not in targets or strategy not in _sim.STRATEGIES:
    return None
  return _sim.Action(targets[who.strip()], strategy)


def message_words(message: str) -> str:
  """The therapist's own words after the strategy of a parsed message ('' when there are none)."""
  rest = message.partition(":")[2].strip()
  return re.split(r"[\s.,;!?-]", rest, maxsplit=1)[1].strip(" .,;!?-") if re.search(r"[\s.,;!?-]", rest) else ""
