"""Host-side kernel-log events (not the GPU's fault) -> one row per episode, for the node_health detector.

An *episode* is the events of one host, category and key (a DIMM, a network device, an OOM victim, a
block device) on one timeline (the wall clock, else one file and boot) with no gap longer than the
incident gap between them; a log without any timestamp makes one episode per file and boot.

Categories and what each row of the episode frame carries (columns are null where they do not apply):

- ``edac``: host DRAM errors (EDAC CE / UE) per DIMM (``ce``, ``ue``, ``mc``);
- ``hung``: tasks blocked in D state (``processes``, ``pids``, ``max_secs``, ``stack_modules``: the
  storage-client and NVIDIA modules named by the stack trace that follows each report, innermost first);
- ``lockup``: soft / hard lockups and RCU stalls (``soft``, ``hard``, ``rcu``, ``cpus``, ``max_secs``);
- ``oom``: one OOM kill (``victim_pid``, ``victim``, ``anon_rss_kb``, ``constraint``, ``invoker``);
- ``fs_error``: filesystem and block-device errors per device (``fs``, ``readonly``, ``detail``);
- ``storage``: a network-storage client losing its server (NFS "not responding", Lustre "Connection
  ... lost") per server (``downs``, ``ups``);
- ``nic_link``: link state of a NIC port or interface (``flaps``: downs after the link had been up,
  ``last_state``); ``mlx5``: mlx5 NIC hardware events (module, power, temperature, health);
- ``cpu_thermal``: CPU thermal throttling (``cpus``, ``max_total_events``);
- ``shutdown``: the node going down: a kernel panic, the kernel's ``reboot: Power down / Restarting system``,
  systemd-shutdown's final stage, logind's ``System is powering down`` (``panic``, ``detail``: the last words).
"""

from __future__ import annotations

import polars as pl

#: kernel_events kinds read here (gpu_hw_error reads none of them)
HOST_KINDS = ("edac", "hung_task", "soft_lockup", "hard_lockup", "rcu_stall", "oom", "fs_error", "storage_client",
              "ib_port", "mlx5", "netdev_carrier", "netdev_link", "cpu_thermal", "shutdown")
# kernel modules a hung task's stack names: network/parallel filesystem clients, FUSE, the NVIDIA driver
STORAGE_MODULES = ("mmfs26", "mmfslinux", "nfs", "nfsv4", "nfsv3", "sunrpc", "lustre", "ptlrpc", "lnet", "osc", "mdc",
                   "llite", "lmv", "lov", "beegfs", "wekafsio", "ceph", "fuse", "cifs", "9p")
_STACK_MODULE = r"\[(" + "|".join(STORAGE_MODULES + ("nvidia", "nvidia_uvm", "nvidia_peermem")) + r")\]"
# a hung task's stack follows it within this many lines
STACK_LINES = 40
#: NIC and PCIe lines that are normal at boot or on a cable event, kept out of every episode: a finding needs a
#: fault, a rate or a consequence (a link that went down after it was up is one; these lines are not).
#: (regular expression on the message, why it is normal, a public log that shows it on a healthy host)
BENIGN_NIC_LINES: tuple[tuple[str, str, str], ...] = (
    (r"Port module event: module \d+, Cable plugged\b",
     "mlx5 found a transceiver/cable in the port: printed at every driver load and on every re-plug",
     "https://jishuzhan.net/article/1911252493641777153 (re-plug, then Link up)"),
    (r"mlx5_pcie_event:\d+:\(pid \d+\): PCIe slot advertised sufficient power",
     "the slot's power budget check at probe passed (the fault is 'Detected insufficient power')",
     "https://jishuzhan.net/article/1911252493641777153; NFS-over-RDMA boot log quoted in #28"),
    (r"Port module event: module \d+, status: plugged and enabled",
     "the FreeBSD mlx5 form of a module detected at boot",
     "https://docs.nvidia.com/networking/display/FREEBSDv371/Port+Down+State+Diagnostics"),
)
BENIGN_NIC_RX = "|".join(f"(?:{rx})" for rx, _, _ in BENIGN_NIC_LINES)
_UP = ("ACTIVE", "UP", "GAINED CARRIER")
_DOWN = ("DOWN", "ERR", "LOST CARRIER")


def _field(name: str) -> pl.Expr:
    return pl.col("fields").str.json_path_match(f"$.{name}")


def _attach_stacks(ev: pl.DataFrame) -> pl.DataFrame:
    """``stack_module`` on each hung_task row: the first storage/driver module of the stack trace after it
    (stack lines are kind ``context``; unparsed lines between them do not end the trace, any other kind does)."""
    anchor = (pl.when(pl.col("kind") == "hung_task").then(pl.col("line"))
              .when(pl.col("kind").is_in(["context", "unknown"])).then(None).otherwise(-1))
    ev = ev.sort("source", "line")
    if not (ev["kind"] == "hung_task").any():  # no report to attach a stack to (most logs): skip the queries
        return ev.with_columns(pl.lit(None, pl.String).alias("stack_module"))
    ev = ev.with_columns(anchor.forward_fill().over("source").alias("_anchor"))
    mods = (ev.filter((pl.col("kind") == "context") & (pl.col("_anchor") > 0)
                      & (pl.col("line") - pl.col("_anchor") <= STACK_LINES))
            .with_columns(pl.col("message").str.extract(_STACK_MODULE).alias("stack_module"))
            .filter(pl.col("stack_module").is_not_null())
            .group_by("source", "_anchor").agg(pl.col("stack_module").sort_by("line").unique(maintain_order=True)
                                               .str.join(","))
            .rename({"_anchor": "line"}))
    # a log without per-line stamps folds the stack into the report itself
    own = pl.col("message").str.extract_all(_STACK_MODULE).list.eval(pl.element().str.strip_chars("[]"))
    return ev.drop("_anchor").join(mods, on=["source", "line"], how="left").with_columns(
        pl.when((pl.col("kind") == "hung_task") & pl.col("stack_module").is_null())
        .then(own.list.unique(maintain_order=True).list.join(",").replace("", None))
        .otherwise(pl.col("stack_module")).alias("stack_module"))


def _decode(ev: pl.DataFrame) -> pl.DataFrame:
    """The parsed fields each category needs, as columns."""
    kind = pl.col("kind").cast(pl.String)
    return ev.with_columns(
        _field("what").alias("what"), _field("state").str.to_uppercase().alias("state"), _field("ekind").alias("ekind"),
        _field("count").cast(pl.Int64, strict=False).alias("count"),
        _field("mc").cast(pl.Int64, strict=False).alias("mc"),
        _field("secs").cast(pl.Int64, strict=False).alias("secs"),
        _field("cpu").cast(pl.Int64, strict=False).alias("cpu"),
        _field("n").cast(pl.Int64, strict=False).alias("total_events"),
        _field("anon_rss_kb").cast(pl.Int64, strict=False).alias("anon_rss_kb"),
        _field("constraint").alias("constraint"),
        _field("fs").alias("fs"), _field("detail").alias("detail"), _field("server").alias("server"),
        pl.coalesce(
            pl.when(kind.is_in(["ib_port", "mlx5"]) & _field("ibdev").is_not_null())
            .then(pl.concat_str(_field("ibdev"), pl.lit(" port "), _field("port"))),
            _field("netdev"), _field("dimm"), _field("dev"), _field("server"), pl.col("pci_bus_id"),
        ).alias("device"),
    )


def _category() -> pl.Expr:
    kind, what = pl.col("kind").cast(pl.String), pl.col("what")
    return (pl.when(kind == "edac").then(pl.when(pl.col("ekind").is_in(["CE", "UE"])).then(pl.lit("edac")))
            .when(kind == "hung_task").then(pl.lit("hung"))
            .when(kind.is_in(["soft_lockup", "hard_lockup", "rcu_stall"])).then(pl.lit("lockup"))
            .when(kind == "oom").then(pl.lit("oom"))
            .when(kind == "fs_error").then(pl.lit("fs_error"))
            .when(kind == "storage_client").then(pl.when(what != "lustre_error").then(pl.lit("storage")))
            .when(kind.is_in(["ib_port", "netdev_carrier", "netdev_link"]) | ((kind == "mlx5") & (what == "link")))
            .then(pl.lit("nic_link"))
            .when(kind == "mlx5").then(pl.lit("mlx5"))
            .when(kind == "cpu_thermal").then(pl.when(what != "power_limit").then(pl.lit("cpu_thermal")))
            .when(kind == "shutdown").then(pl.lit("shutdown")))


def _key() -> pl.Expr:
    """What one episode is about within its category: the DIMM, device, server or OOM victim."""
    cat = pl.col("category")
    return (pl.when(cat == "edac").then(pl.coalesce(pl.col("device"), pl.format("MC{}", pl.col("mc"))))
            .when(cat == "oom").then(pl.col("victim_pid").cast(pl.String))
            .when(cat.is_in(["fs_error", "storage", "nic_link", "mlx5"])).then(pl.col("device"))
            .otherwise(pl.lit("")).fill_null(""))


def _oom_victims(ev: pl.DataFrame) -> pl.DataFrame:
    """``victim_pid``: "X invoked oom-killer" belongs to the next kill of its file (the victim is named after
    the memory report); the kill, its context line and the reaper line name the victim themselves."""
    is_oom = pl.col("kind") == "oom"
    named = pl.when(is_oom & pl.col("what").is_in(["killed", "context", "reaped"])).then(pl.col("pid"))
    ev = ev.sort("source", "line").with_columns(named.alias("_v"))
    ev = ev.with_columns(pl.col("_v").backward_fill().over("source", "host").alias("_next"))
    return ev.with_columns(pl.when(is_oom).then(pl.coalesce("_v", "_next")).alias("victim_pid")).drop("_v", "_next")


def _flaps(ev: pl.DataFrame) -> pl.DataFrame:
    """``is_flap`` on a link-down row of a device whose link had been up before it (INIT -> ACTIVE at boot is
    not a flap; a carrier lost on a virtual interface is ignored upstream)."""
    nic = pl.col("category") == "nic_link"
    up = nic & pl.col("state").is_in(_UP)
    down = nic & pl.col("state").is_in(_DOWN)
    timeline = [pl.col("host").fill_null(""), pl.col("device")]
    ev = ev.sort("host", "source", "boot", "line").with_columns(
        up.cast(pl.Int32).cum_max().shift(1, fill_value=0).over(timeline).alias("_was_up"))
    return ev.with_columns((down & (pl.col("_was_up") == 1)).alias("is_flap")).drop("_was_up")


def host_events(normalized: pl.DataFrame, ignore_interfaces: str) -> pl.DataFrame:
    """The host-side events of the kernel logs, one row each, with ``category`` and ``key``, on the job's
    host names and clocks (``normalized``: ``JobContext.kernel_events``, see
    :func:`forensics.facts.kernel_events.normalize_events`)."""
    ev = _attach_stacks(normalized)
    ev = ev.filter(pl.col("kind").cast(pl.String).is_in(HOST_KINDS)
                   & ~((pl.col("kind").cast(pl.String) == "mlx5") & pl.col("message").str.contains(BENIGN_NIC_RX)))
    if ev.height == 0:
        return ev.with_columns(pl.lit(None, pl.String).alias("category"))
    ev = _decode(ev).with_columns(_category().alias("category")).filter(pl.col("category").is_not_null())
    ev = ev.filter(~((pl.col("category") == "nic_link")
                     & pl.col("device").str.contains(ignore_interfaces).fill_null(False)))
    ev = _oom_victims(ev)
    return _flaps(ev.with_columns(_key().alias("key")))


def episodes(ev: pl.DataFrame, gap_s: float) -> pl.DataFrame:
    """``episode`` id per event: same host, category, key and timeline, no gap above ``gap_s``."""
    timeline = (pl.when(pl.col("clock") == "wall").then(pl.lit("wall"))
                .otherwise(pl.format("{}#{}", pl.col("source"), pl.col("boot").fill_null(0))))
    group = [pl.col("host").fill_null(""), "category", "key", "_tl"]
    ev = ev.with_columns(timeline.alias("_tl")).sort("host", "category", "key", "_tl", "t", "line", nulls_last=True)
    gap = pl.col("t").diff().over(group) > int(gap_s * 1e9)
    new = pl.int_range(pl.len()).over(group).eq(0) | gap.fill_null(False)
    return ev.with_columns(new.cum_sum().alias("episode")).drop("_tl")


def name_matches(col: str, pattern: str) -> pl.Expr:
    """Whether the process name in ``col`` matches ``pattern`` (false when there is none)."""
    return pl.col(col).str.contains(pattern).fill_null(False)


def summarize(ev: pl.DataFrame, trainer: str, max_evidence: int) -> pl.DataFrame:
    """One row per episode with what the findings need (see the module docstring)."""
    cat_edac = pl.col("ekind")
    oom_named = pl.col("what").is_in(["killed", "context"])
    nic_state = pl.col("state").is_in(_UP + _DOWN)
    return ev.group_by("episode").agg(
        pl.col("host").first(), pl.col("category").first(), pl.col("key").first(), pl.col("clock").first(),
        pl.col("source").first(), pl.col("line").first().alias("first_line"), pl.len().alias("events"),
        pl.col("t").min().alias("first_t"), pl.col("t").max().alias("last_t"),
        pl.col("count").filter(cat_edac == "CE").sum().alias("ce"),
        pl.col("count").filter(cat_edac == "UE").sum().alias("ue"),
        pl.col("mc").drop_nulls().first().alias("mc"),
        pl.col("process").filter(pl.col("kind") != "oom").drop_nulls().unique(maintain_order=True).alias("processes"),
        pl.col("pid").filter(pl.col("kind") != "oom").drop_nulls().unique(maintain_order=True).alias("pids"),
        name_matches("process", trainer).filter(pl.col("kind") != "oom").any().alias("trainer_blocked"),
        pl.col("secs").max().alias("max_secs"), pl.col("secs").min().alias("min_secs"),
        pl.col("stack_module").drop_nulls().str.split(",").list.explode().unique(maintain_order=True)
        .alias("stack_modules"),
        (pl.col("kind") == "soft_lockup").sum().alias("soft"), (pl.col("kind") == "hard_lockup").sum().alias("hard"),
        (pl.col("kind") == "rcu_stall").sum().alias("rcu"),
        pl.col("cpu").drop_nulls().unique().sort().alias("cpus"),
        pl.col("victim_pid").drop_nulls().first(),
        pl.col("process").filter(oom_named).drop_nulls().first().alias("victim"),
        pl.col("process").filter(pl.col("what") == "invoked").drop_nulls().first().alias("invoker"),
        pl.col("anon_rss_kb").max(), pl.col("constraint").drop_nulls().first(),
        pl.col("fs").drop_nulls().first(), (pl.col("what") == "readonly").any().alias("readonly"),
        pl.col("detail").drop_nulls().first(),
        pl.col("what").is_in(["nfs_down", "lustre_lost"]).sum().alias("downs"),
        pl.col("what").is_in(["nfs_ok", "lustre_ok"]).sum().alias("ups"),
        pl.col("is_flap").sum().alias("flaps"), pl.col("state").filter(nic_state).last().alias("last_state"),
        pl.col("pci_bus_id").drop_nulls().first().alias("bus_id"), pl.col("what").drop_nulls().first().alias("what"),
        pl.col("total_events").max().alias("max_total_events"),
        (pl.col("what") == "throttle").sum().alias("throttles"),
        (pl.col("what") == "panic").any().alias("panic"),
        pl.col("detail").filter(pl.col("kind") == "shutdown").drop_nulls().last().alias("last_words"),
        pl.struct(pl.col("source"), pl.col("line"), pl.col("time_text").alias("time"), pl.col("kind").cast(pl.String),
                  pl.col("message").str.slice(0, 300).alias("text")).head(max_evidence).alias("evidence"),
    ).sort("host", "category", "first_t", "first_line", nulls_last=True)
