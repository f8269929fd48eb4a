"""The wait-for graph's verdict in words: the finding that leads a hang across groups, and its facts.

Pure: takes the graph and the programs `analysis.wait_for` built, and how to name a group and a rank's dump.
"""

from __future__ import annotations

from torchtriage.analysis.confidence import ALL_RANK_CALLS, LEFT_NOTHING, PREMISE
from torchtriage.analysis.wait_for import ALL_RANK_CALL, P2P_UNRECORDED, IssuedOp, Program, WaitFor
from torchtriage.model import Evidence, Finding
from torchtriage.ranks import format_ranks

_MAX_EVIDENCE = 6


def _other_story_said(graph: WaitFor) -> str:
    """The other story the records tell where a rank's loop seems to have ended a step sooner than its peers'."""
    stories = graph.departure["two_stories"]
    entered, staying = format_ranks(stories["entered"]), format_ranks(stories["staying"])
    return (
        f"; {entered} went from the end of a step to a call it never made before while {staying} went on to "
        f"another step: the loop of {entered} ended sooner (fewer batches, a stop condition of its own), or that "
        f"of {staying} ran longer or made one op more. No rank outside them shows how many steps the loop had: "
        f"{format_ranks(sorted(graph.cycle))} are the candidates"
    )


def _waits(graph: WaitFor, programs: dict[int, Program], label_of, ranks: list[int]) -> str:
    """'ranks 0-1, 3 wait in all_reduce seq 4 of pg 1 for rank 2; ...', one clause per place."""
    by_place: dict[tuple, list[int]] = {}
    # The ranks waiting in one op share one set of targets (thousands of ranks, at 16k): each distinct set
    # is sorted once and stands in the key by its number.
    number_of_set: dict[int, int] = {}
    number_of_targets: dict[tuple[int, ...], int] = {}
    for rank in ranks:
        op = programs[rank].waiting
        if op is not None:
            targets = graph.edges[rank]
            number = number_of_set.get(id(targets))
            if number is None:
                number = number_of_set[id(targets)] = number_of_targets.setdefault(
                    tuple(sorted(targets)), len(number_of_targets)
                )
            by_place.setdefault((op.group, op.seq, op.op, op.peer, op.batched, number), []).append(rank)
    targets_numbered = list(number_of_targets)
    clauses = []
    for (group, seq, op, peer, batched, number), waiting in sorted(by_place.items(), key=lambda item: item[1][0]):
        targets = list(targets_numbered[number])
        verb = "waits" if len(waiting) == 1 else "wait"
        what = IssuedOp(group, seq, op, None, 0, peer=peer, batched=batched).what(label_of(waiting[0], group))
        clauses.append(f"{format_ranks(waiting)} {verb} in {what} for {format_ranks(targets)}")
    return "; ".join(clauses)


def _ends(graph: WaitFor, programs: dict[int, Program], label_of, ranks: list[int]) -> list[str]:
    """'rank 3 waits in all_reduce seq 4 of pg 1 for rank 5 (no dump)', one clause per rank."""
    clauses = []
    for rank in ranks[:8]:
        op = programs[rank].waiting
        what = op.what(label_of(rank, op.group)) if op is not None else "an op"
        clauses.append(f"rank {rank} waits in {what} for {format_ranks(sorted(graph.unknown[rank]))} (no dump)")
    return clauses


def _held_in(programs: dict[int, Program], label_of, ranks: list[int]) -> str:
    """'ranks 0-2 wait in all_gather seq 7 of mesh_cp (pg 1)', one clause per op (at most 4)."""
    by_op: dict[str, list[int]] = {}
    for rank in ranks:
        op = programs[rank].waiting
        by_op.setdefault(op.what(label_of(rank, op.group)) if op is not None else "an op", []).append(rank)
    verb = {True: "waits", False: "wait"}
    clauses = [f"{format_ranks(held)} {verb[len(held) == 1]} in {what}" for what, held in by_op.items()]
    return "; ".join(clauses[:4]) + ("; ..." if len(clauses) > 4 else "")


def _per_culprit(programs: dict[int, Program], label_of, culprits: list[int], clause: str) -> str:
    """One clause per culprit (at most 8), each naming the op it waits in: `clause` with {rank} and {op}."""
    said = []
    for rank in culprits[:8]:
        op = programs[rank].waiting
        said.append(clause.format(rank=rank, op=op.what(label_of(rank, op.group))))
    return "; ".join(said)


def finding(graph: WaitFor, programs: dict[int, Program], label_of, path_of) -> Finding:
    """The graph's verdict as the finding that leads: who departed, with the ops that show it.

    `label_of(rank, group name)` names a group for people; `path_of(rank)` is the rank's dump."""
    waiting = sorted(r for r, targets in graph.edges.items() if targets)
    culprits = graph.culprits
    facts: dict = {"decided_by": graph.decided_by}
    if graph.decided_by == ALL_RANK_CALL:
        facts[PREMISE] = ALL_RANK_CALLS
    if graph.kind == "sink":
        who = "waits" if len(culprits) == 1 else "wait"
        last = [programs[r].last for r in culprits if programs[r].last is not None]
        since = f" (its last op: {last[0].describe(label_of(culprits[0], last[0].group))})" if last else ""
        message = (
            f"{format_ranks(culprits)} {who} in no collective{since} while the others wait for it: "
            f"{_waits(graph, programs, label_of, waiting)}"
        )
        kind, evidence_ranks = "fr.not_joined", culprits
        if last:
            facts |= {"seq": last[0].seq + 1, "group": label_of(culprits[0], last[0].group)}
            if last[0].site:
                facts["site"] = last[0].site
    elif graph.kind == "shifted":
        rank, extra, instead = culprits[0], graph.departure["issued"], graph.departure["peers_issued"]
        idle = graph.departure["idle"]
        label = label_of(rank, extra.group)
        message = (
            f"rank {rank} issued one op more: at {extra.describe(label)}, a call it never made before, where "
            f"{format_ranks(idle)} issued {instead.describe(label)}. Alike collectives from different lines complete "
            "together (no backend knows a call site), so each of its later ops paired with its peers' next one, and "
            f"its call sites since are theirs one seq later, until they ran out of ops: {format_ranks(idle)} "
            f"{'waits' if len(idle) == 1 else 'wait'} in no collective, {_waits(graph, programs, label_of, waiting)}"
        )
        facts |= {"seq": extra.seq, "group": label, "issued": extra.what(label)}
        if extra.site:
            facts["site"] = extra.site
        kind, evidence_ranks = "fr.extra_op", [rank, *idle]
    elif graph.kind == "odd_waiter":
        issued, instead, idle = graph.departure["issued"], graph.departure["peers_issued"], graph.departure["idle"]
        label = label_of(culprits[0], issued.group)
        others = graph.departure["peers"]
        message = (
            f"{format_ranks(culprits)} issued {issued.describe(label)}, where {format_ranks(others)} issued "
            f"{instead.what(label)}: one side departed, and the minority did (the rest agree); "
            f"{format_ranks(idle)} {'waits' if len(idle) == 1 else 'wait'} in no collective, which only one more "
            "departure would explain, or a wait for it that no dump records (a pipeline's send or recv gloo does "
            f"not record, a communicator's creation, a store wait): {_waits(graph, programs, label_of, waiting)}"
        )
        facts |= {"seq": issued.seq, "group": label, "issued": issued.what(label)}
        if issued.site:
            facts["site"] = issued.site
        kind, evidence_ranks = "fr.op_mismatch", [*culprits, *others[:1], *idle[:1]]
    elif graph.kind == "lone_waiter":
        rank, idle = graph.departure["waiter"], graph.departure["idle"]
        op = programs[rank].waiting
        label = label_of(rank, op.group)
        message = (
            f"rank {rank} alone waits in {op.describe(label)}, which {format_ranks(idle)} (the rest of its group) "
            "never issued and wait in no collective: one rank departed either way: rank "
            f"{rank} made one op more (from a line it used before, so no call site shows it), or "
            f"{format_ranks(idle)} are held where no dump records (creating a group's communicator, a store wait) "
            f"by one of them; their stacks tell — {format_ranks(graph.candidates)} are the candidates"
        )
        facts |= {"undecided": True, "candidates": graph.candidates, "seq": op.seq, "group": label}
        kind, evidence_ranks = "fr.not_joined", graph.candidates
    elif graph.kind == "stopped":
        clauses = _per_culprit(programs, label_of, culprits, "rank {rank}'s dump lists {op} as pending")
        message = (
            f"{clauses}, which its peers completed: its device stopped (a kernel that never returns, a "
            "GPU fault) or its progress thread stopped updating its flight recorder (a wedged process); "
            f"{_waits(graph, programs, label_of, waiting)}"
        )
        kind, evidence_ranks = "fr.progress_stopped", culprits
    elif graph.kind == "not_begun":
        clauses = _per_culprit(programs, label_of, culprits, "rank {rank}'s device never began {op}")
        message = (
            f"{clauses}, and is inside no other op: work queued before it on its GPU never ended (a "
            "kernel that never returns, a GPU that stopped); "
            f"{_waits(graph, programs, label_of, waiting)}"
        )
        kind, evidence_ranks = "fr.not_started", culprits
    elif graph.kind == "no_dump":
        missing = culprits or graph.departure.get("no_dump", [])  # the members known to have left no dump
        ends = graph.departure.get("waiting_for_it", [])
        waits = _waits(graph, programs, label_of, waiting) if waiting else ""
        ended = "; ".join(_ends(graph, programs, label_of, ends))
        if not missing and "above" in graph.departure:
            above = graph.departure["above"]
            message = (
                f"{_held_in(programs, label_of, ends)}: an op every rank whose dump shows its group issued alike, "
                "with nothing the dumps leave out (a root, a peer) to differ on; such a collective "
                "completes once its members join, so a member that left no dump holds them. Every rank up to "
                f"{above} left one: it is a rank above {above}, which the dumps cannot name (gloo's record no "
                "group's members, nor the job's size: its launcher's log or the run's identity records say how "
                f"many ranks it had); unless its dump was lost, and it waits for {format_ranks(ends)} in an op of "
                f"its own: then {format_ranks(ends)} may have departed" + (f"; {waits}" if waits else "")
            )
            facts |= {"undecided": True, "candidates": ends, "candidates_above": above}
        elif not missing:
            held = format_ranks(ends)
            message = (
                f"{held} wait in ops every member the dumps show has issued and that never completed: the members "
                "disagree in what the dumps do not record (a broadcast's root, a send's peer), or a member that "
                "left no dump holds them (gloo records no group's members; a rank above the highest that dumped "
                f"leaves no trace): {held} are the candidates unless a rank is missing"
                + (f"; {waits}" if waits else "")
            )
            facts |= {"undecided": True, "candidates": ends}
        elif culprits:
            message = (
                f"{format_ranks(missing)} left no dump, and the waits end there: {ended}"
                + (f"; {waits}" if waits else "")
                + " — it died, exited or hangs where its flight recorder could not dump"
            )
            facts[PREMISE] = LEFT_NOTHING
        else:
            message = f"the waits end in ranks that left no dump: {ended} — {format_ranks(missing)} are the candidates"
            facts |= {"undecided": True, "candidates": missing}
        kind, evidence_ranks = "fr.missing_dump", ends
    elif graph.kind == "p2p" and culprits:
        rank, detail = culprits[0], graph.departure
        in_p2p = sorted(r for r, p in programs.items() if p.waiting is not None and p.waiting.op == P2P_UNRECORDED)
        last = programs[rank].last
        where = f" before {last.describe(label_of(rank, last.group))}" if last else ""
        message = (
            f"{format_ranks(culprits)} departed: it issued {detail['unrecorded_ops']} send/recv op(s){where}, where "
            f"each of its earlier steps issued {detail['usually']} (ops this backend's flight recorder counts but does "
            f"not record, gloo) — a send or recv skipped; {format_ranks(in_p2p)} "
            f"{'waits' if len(in_p2p) == 1 else 'wait'} in a send or recv, {_waits(graph, programs, label_of, waiting)}"
        )
        kind, evidence_ranks = "fr.p2p_skipped", [*culprits, *in_p2p]
        if last:
            facts |= {"seq": last.seq, "group": label_of(rank, last.group)}
            if last.site:
                facts["site"] = last.site
    elif graph.kind == "p2p":
        in_p2p = graph.candidates
        who = "waits" if len(in_p2p) == 1 else "wait"
        message = (
            f"{_waits(graph, programs, label_of, waiting)}; {format_ranks(in_p2p)} {who} in a send or recv after "
            f"{'its' if len(in_p2p) == 1 else 'their'} last collective, which this backend's flight recorder does not "
            f"record (gloo): the {'peer it waits' if len(in_p2p) == 1 else 'peers they wait'} for "
            f"{'is' if len(in_p2p) == 1 else 'are'} not in the dumps — {format_ranks(in_p2p)} and "
            f"{'its peer are' if len(in_p2p) == 1 else 'their peers are'} the candidates (a stage that skipped its "
            "send, or a recv posted before its send); the stacks name the peer (recv's src, send's dst)"
        )
        kind, evidence_ranks = "fr.waits_in_p2p", in_p2p
        facts |= {"undecided": True, "candidates": in_p2p}
    else:
        kind, evidence_ranks = "fr.deadlock", graph.cycle
        cycle = _waits(graph, programs, label_of, graph.cycle)
        if culprits:
            departure = graph.departure
            issued: IssuedOp | None = departure.get("issued")
            peers: IssuedOp | None = departure.get("peers_issued")
            said = []
            if issued is not None:
                said.append(f"it issued {issued.describe(label_of(culprits[0], issued.group))}")
                facts |= {
                    "seq": issued.seq,
                    "group": label_of(culprits[0], issued.group),
                    "issued": issued.what(label_of(culprits[0], issued.group)),
                }
                if issued.site:
                    facts["site"] = issued.site
            if peers is not None:
                said.append(f"where its peers issued {peers.describe(label_of(culprits[0], peers.group))}")
            elif departure.get("usually_next"):
                group, op, site = departure["usually_next"][0]
                said.append(
                    f"where its earlier steps issued {op} of {label_of(culprits[0], group)}"
                    + (f" at {site}" if site else "")
                )
            message = (
                f"deadlock across process groups: {cycle} — {format_ranks(culprits)} departed first "
                f"({graph.decided_by}): {' '.join(said)}"
            )
            if "two_stories" in departure:
                message += _other_story_said(graph)
                facts |= {"candidates": sorted(graph.cycle), "loop_length": True}
        else:
            message = (
                f"deadlock across process groups: {cycle} — the programs of {format_ranks(graph.cycle)} do not tell "
                "which departed first: they are the candidates"
            )
            facts["undecided"] = True
            facts["candidates"] = graph.cycle
        facts["cycle"] = graph.cycle
    victims = sorted(set(waiting) - set(graph.cycle) - set(culprits))
    if victims and graph.kind == "cycle":
        message += f"; behind them, {_waits(graph, programs, label_of, victims)}"
    if victims:
        facts["waiting_on_it"] = format_ranks(victims)
    evidence = []
    for rank in [*culprits, *(r for r in evidence_ranks if r not in culprits)][:_MAX_EVIDENCE]:
        program = programs.get(rank)  # a rank without a dump has no program
        op = (program.waiting or program.last) if program is not None else None
        if op is None:
            continue
        state = "waits in" if program.waiting is not None else "in no collective; its last op was"
        targets = f", for {format_ranks(sorted(graph.edges[rank]))}" if graph.edges[rank] else ""
        evidence.append(
            Evidence(
                "flight_recorder",
                path_of(rank),
                op.index,
                rank,
                f"{state} {op.describe(label_of(rank, op.group))}{targets}",
            )
        )
    blamed = culprits or graph.candidates
    return Finding(kind, blamed, message, "primary", "hang", evidence, facts, blames=bool(culprits))


def facts(graph: WaitFor) -> dict:
    """The graph itself, for JSON readers: who waits for whom (at most 64 ranks)."""
    waiting = [(rank, targets) for rank, targets in sorted(graph.edges.items()) if targets][:64]
    shown = {str(rank): format_ranks(sorted(targets)) for rank, targets in waiting}
    return {"waits_for": shown} | ({"cycle": graph.cycle} if graph.cycle else {})
