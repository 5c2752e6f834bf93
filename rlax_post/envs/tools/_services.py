"""The typed tools of the three services (files, calendar, ledger) and how a call is executed.

A `Tool` has a name (`service.verb`), a one-line description, a JSON schema of its arguments object
(validated by `_schema.validate` before the tool runs), and a function of (world, arguments) returning a
JSON-serialisable result, or raising `ToolError` when the call is well formed but cannot be carried out
(no such file, event or account; insufficient funds). Tools never mutate their arguments.

`produces` names the kinds of value a tool's result reveals and `consumes` the kinds an argument needs; task
synthesis walks these edges (`_tasks`) to build calls whose inputs come from earlier calls' results.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from rlax_post.envs.tools import _schema
from rlax_post.envs.tools import _world


class ToolError(Exception):
  """A well-formed call the services could not carry out (its text is shown to the agent)."""


@dataclasses.dataclass(frozen=True)
class Tool:
  """One typed tool.

  Attributes:
    name: 'service.verb'.
    description: one line, shown to the agent.
    parameters: JSON schema of the arguments object.
    fn: (world, arguments) -> JSON-serialisable result; may mutate the world; raises `ToolError`.
    consumes: argument name -> kind of value that must come from an earlier result (e.g. 'event_id').
    produces: kinds of value the result reveals.
  """
  name: str
  description: str
  parameters: Mapping[str, Any]
  fn: Callable[[_world.World, dict], Any]
  consumes: Mapping[str, str] = dataclasses.field(default_factory=dict)
  produces: tuple[str, ...] = ()


def _obj(properties: dict, required: tuple[str, ...] = ()) -> dict:
  return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_STR = {"type": "string", "minLength": 1, "maxLength": 200}
_FILE_NAME = {"type": "string", "pattern": r"[a-z0-9_]{1,40}\.txt"}
_DAY = {"type": "integer", "minimum": _world.DAYS[0], "maximum": _world.DAYS[1]}
_HOUR = {"type": "integer", "minimum": _world.HOURS[0], "maximum": _world.HOURS[1]}
_EVENT_ID = {"type": "string", "pattern": r"evt_[0-9]+"}
_ACCOUNT_ID = {"type": "string", "pattern": r"acc_[0-9]+"}


def _event(world: _world.World, eid: str) -> dict:
  e = world.events[eid]
  return {"id": eid, "title": e["title"], "day": e["day"], "hour": e["hour"], "attendees": list(e["attendees"])}


def _need_event(world: _world.World, eid: str) -> None:
  if eid not in world.events:
    raise ToolError(f"no event with id {eid!r}")


def _need_account(world: _world.World, aid: str) -> None:
  if aid not in world.accounts:
    raise ToolError(f"no account with id {aid!r}")


def _need_file(world: _world.World, name: str) -> None:
  if name not in world.files:
    raise ToolError(f"no file named {name!r}")


def _files_list(world, args):
  prefix = args.get("prefix", "")
  return {"files": sorted(n for n in world.files if n.startswith(prefix))}


def _files_read(world, args):
  _need_file(world, args["name"])
  return {"name": args["name"], "content": world.files[args["name"]]}


def _files_create(world, args):
  if args["name"] in world.files:
    raise ToolError(f"a file named {args['name']!r} already exists")
  world.files[args["name"]] = args["content"]
  return {"created": args["name"]}


def _files_delete(world, args):
  _need_file(world, args["name"])
  del world.files[args["name"]]
  return {"deleted": args["name"]}


def _calendar_list(world, args):
  day = args.get("day")
  return {"events": [_event(world, eid) for eid in sorted(world.events)
                     if day is None or world.events[eid]["day"] == day]}


def _calendar_find(world, args):
  title = args["title"].strip().lower()
  return {"events": [_event(world, eid) for eid in sorted(world.events)
                     if world.events[eid]["title"].lower() == title]}


def _calendar_create(world, args):
  unknown = sorted(set(args["attendees"]) - set(world.people))
  if unknown:
    raise ToolError(f"unknown attendees {unknown}")
  eid = f"evt_{world.next_event}"
  world.next_event += 1
  world.events[eid] = {"title": args["title"], "day": args["day"], "hour": args["hour"],
                       "attendees": sorted(set(args["attendees"]))}
  return _event(world, eid)


def _calendar_move(world, args):
  _need_event(world, args["id"])
  world.events[args["id"]].update(day=args["day"], hour=args["hour"])
  return _event(world, args["id"])


def _calendar_cancel(world, args):
  _need_event(world, args["id"])
  del world.events[args["id"]]
  return {"cancelled": args["id"]}


def _ledger_find_account(world, args):
  aid = world.account_of(args["owner"])
  if aid is None:
    raise ToolError(f"no account owned by {args['owner']!r}")
  return {"account": aid, "owner": args["owner"]}


def _ledger_balance(world, args):
  _need_account(world, args["account"])
  return {"account": args["account"], "balance": world.accounts[args["account"]]["balance"]}


def _ledger_transfer(world, args):
  src, dst, amount = args["from"], args["to"], args["amount"]
  _need_account(world, src)
  _need_account(world, dst)
  if src == dst:
    raise ToolError("cannot transfer to the same account")
  if world.accounts[src]["balance"] < amount:
    raise ToolError(f"insufficient funds in {src!r}")
  world.accounts[src]["balance"] -= amount
  world.accounts[dst]["balance"] += amount
  tx = {"id": f"tx_{world.next_transfer}", "from": src, "to": dst, "amount": amount}
  world.next_transfer += 1
  world.transfers.append(tx)
  return dict(tx)


_TOOL_LIST = (
    Tool("files.list", "List file names, optionally only those starting with a prefix.",
         _obj({"prefix": {"type": "string", "maxLength": 40}}), _files_list, produces=("file_names",)),
    Tool("files.read", "Read a file's content.", _obj({"name": _FILE_NAME}, ("name",)), _files_read,
         produces=("content",)),
    Tool("files.create", "Create a new file with the given content.",
         _obj({"name": _FILE_NAME, "content": {"type": "string", "maxLength": 2000}}, ("name", "content")),
         _files_create, consumes={"content": "content"}),
    Tool("files.delete", "Delete a file.", _obj({"name": _FILE_NAME}, ("name",)), _files_delete,
         consumes={"name": "file_names"}),
    Tool("calendar.list", "List events (id, title, day, hour, attendees), optionally of one day.",
         _obj({"day": _DAY}), _calendar_list, produces=("event_id", "attendees")),
    Tool("calendar.find", "Find events by exact title (case-insensitive).", _obj({"title": _STR}, ("title",)),
         _calendar_find, produces=("event_id", "attendees")),
    Tool("calendar.create", "Create an event; returns it with its new id.",
         _obj({"title": _STR, "day": _DAY, "hour": _HOUR,
               "attendees": {"type": "array", "items": _STR, "minItems": 1, "maxItems": 8}},
              ("title", "day", "hour", "attendees")), _calendar_create, consumes={"attendees": "attendees"},
         produces=("event_id",)),
    Tool("calendar.move", "Move an event to another day and hour.",
         _obj({"id": _EVENT_ID, "day": _DAY, "hour": _HOUR}, ("id", "day", "hour")), _calendar_move,
         consumes={"id": "event_id"}),
    Tool("calendar.cancel", "Cancel (delete) an event.", _obj({"id": _EVENT_ID}, ("id",)), _calendar_cancel,
         consumes={"id": "event_id"}),
    Tool("ledger.find_account", "Find the account id of a person.", _obj({"owner": _STR}, ("owner",)),
         _ledger_find_account, produces=("account_id",)),
    Tool("ledger.balance", "Read an account's balance.", _obj({"account": _ACCOUNT_ID}, ("account",)),
         _ledger_balance, consumes={"account": "account_id"}),
    Tool("ledger.transfer", "Transfer an integer amount between two accounts.",
         _obj({"from": _ACCOUNT_ID, "to": _ACCOUNT_ID, "amount": {"type": "integer", "minimum": 1,
                                                                  "maximum": 100000}},
              ("from", "to", "amount")), _ledger_transfer, consumes={"from": "account_id", "to": "account_id"}),
)
TOOLS: Mapping[str, Tool] = {t.name: t for t in _TOOL_LIST}


def execute(world: _world.World, name: str, args: dict) -> tuple[str, Any]:
  """Runs tool `name` on `world` with `args` (a parsed JSON object).

  Returns:
    (kind, payload): ('executed', result), or an error kind with its message: ('unknown_tool', ...),
    ('invalid_arguments', ...) when `args` fails the tool's schema (the world is untouched), or
    ('execution_error', ...) when the tool raised `ToolError` (the world is untouched: tools check before
    they write).
  """
  tool = TOOLS.get(name)
  if tool is None:
    return "unknown_tool", f"unknown tool {name!r}; tools: {', '.join(sorted(TOOLS))}"
  error = _schema.validate(args, tool.parameters)
  if error is not None:
    return "invalid_arguments", error
  try:
    return "executed", tool.fn(world, args)
  except ToolError as e:
    return "execution_error", str(e)


def signature(tool: Tool) -> str:
  """A compact one-line rendering of a tool for prompts: `ledger.transfer(from: string, ...): description`."""
  parts = []
  props, required = tool.parameters["properties"], set(tool.parameters["required"])
  for key, sub in props.items():
    text = sub["type"]
    if "minimum" in sub:
      text += f" {sub['minimum']}..{sub['maximum']}"
    if sub["type"] == "array":
      text = f"array of {sub['items']['type']}"
    parts.append(f"{key}{'' if key in required else '?'}: {text}")
  return f"{tool.name}({', '.join(parts)}): {tool.description}"
