"""``specterbench list`` (strategies, models and profiles, with the plugin each comes from) and ``specterbench
plugins`` (every plugin loaded, its source and hooks)."""

from __future__ import annotations

import json

from specterbench.plugins.host import DISABLE_ENV, get_host
from specterbench.plugins.listing import describe


def cmd_plugins(args) -> int:
    data = describe(get_host())
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    autoload = "on" if data["autoload"] else f"off ({DISABLE_ENV})"
    print(f"plugins (entry-point autoload {autoload}; blocked: {', '.join(data['blocked']) or 'none'}):")
    width = max((len(p["name"]) for p in data["plugins"]), default=0)
    for p in data["plugins"]:
        print(f"  {p['name']:<{width}}  {p['distribution']} {p['version']}  [{p['source']}: {p['module']}]")
        print(f"  {'':<{width}}  hooks: {', '.join(p['hooks']) or 'none'}")
        for label, names in p["registers"].items():
            print(f"  {'':<{width}}  {label}: {', '.join(names)}")
    if data["failed"]:
        print("failed to load (left out):")
        for p in data["failed"]:
            print(f"  {p['name']}  {p['distribution']} {p['version']}  [{p['module']}]: {p['error']}")
    if data["refused"]:
        print("refused at registration (left out; the rest of each plugin loaded):")
        for r in data["refused"]:
            print(f"  {r['kind']} {r['name']}  [{r['plugin']}: {r['class']}]")
            for problem in r["problems"]:
                print(f"      {problem}")
    if data["contested"]:
        print("registered by two or more plugins (neither runs under the bare name; pick one as plugin:name):")
        for c in data["contested"]:
            owners = ", ".join(f"{o['plugin']} ({o['distribution']} {o['version']})" for o in c["owners"])
            print(f"  {c['kind']} {c['name']}: {owners}")
    if data["not_loaded"]:
        print("installed, not loaded:")
        for p in data["not_loaded"]:
            print(f"  {p['name']}  {p['distribution']} {p['version']}  [{p['module']}]: {p['reason']}")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("list", help="strategies, models and profiles, with the plugin each comes from")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)
    s = sub.add_parser("plugins", help="installed plugins: distribution, version, source and the hooks each "
                                              "implements")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_plugins)
    return s


def cmd_list(args) -> int:
    host = get_host()
    data = {}
    for kind, reg in (("strategies", host.strategies()), ("models", host.models()), ("profiles", host.profiles()),
                      ("host profiles", host.host_profiles())):
        data[kind] = []
        for name in reg.names():
            entry = reg.entry(name)
            obj = entry.obj
            desc = getattr(obj, "description", "") or getattr(obj, "accelerator", "") or getattr(obj, "cpu", "")
            data[kind].append({"name": name, "plugin": entry.plugin.name,
                               "distribution": f"{entry.plugin.distribution} {entry.plugin.version}",
                               "description": desc})
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for kind, items in data.items():
        print(f"{kind}:")
        width = max(len(i["name"]) for i in items) if items else 0
        for i in items:
            print(f"  {i['name']:<{width}}  [{i['plugin']} · {i['distribution']}]  {i['description']}")
    return 0
