"""Real public log text for the #28 tests (kept verbatim; where each excerpt comes from is said above it).

The shared samples under ../shared/sample_data come first (read through conftest's ``shared_path``); these
excerpts cover classes the shared samples do not hold."""

from __future__ import annotations

# A Mellanox port re-plugged on a healthy host: module detected, link up, IPv6 ready (dmesg).
# Source: https://jishuzhan.net/article/1911252493641777153 ("Mellanox网卡网线插入后驱动的几个日志", 2025-04).
BOOT_REPLUG = """\
[32704.121294] mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged
[32707.399693] mlx5_core 0000:01:00.1: Port module event: module 1, Cable plugged
[32710.060490] mlx5_core 0000:01:00.0 enp1s0f0: Link up
[32710.060509] IPv6: ADDRCONF(NETDEV_CHANGE): enp1s0f0: link becomes ready
[32710.060809] mlx5_core 0000:01:00.1 enp1s0f1: Link up
[32710.061629] IPv6: ADDRCONF(NETDEV_CHANGE): enp1s0f1: link becomes ready
"""

# mlx5 probe at start-up in syslog form (ConnectX-5, PCIe Gen3 x16): the lines before an unrelated kernel bug.
# Source: netdev / linux-rdma mailing lists, Chuck Lever III, thread "system hang on start-up (mlx5?)",
# quoted in Thomas Gleixner's reply of 2023-05-28 (lore.kernel.org/netdev), host manet.1015granger.net.
BOOT_SYSLOG = """\
May 27 15:47:45 manet.1015granger.net kernel: mlx5_core 0000:81:00.0: firmware version: 16.35.2000
May 27 15:47:45 manet.1015granger.net kernel: mlx5_core 0000:81:00.0: 126.016 Gb/s available PCIe bandwidth (8.0 GT/s PCIe x16 link)
May 27 15:47:46 manet.1015granger.net kernel: mlx5_core 0000:81:00.0: Port module event: module 0, Cable plugged
May 27 15:47:46 manet.1015granger.net kernel: mlx5_core 0000:81:00.0: mlx5_pcie_event:301:(pid 10): PCIe slot advertised sufficient power (27W).
"""  # noqa: E501 -- verbatim log lines (test data)

# An EKS job over EFA whose peer did not answer the handshake (security group without the outbound rule):
# aws-ofi-nccl's provider error, the NCCL return-code trail (6 = ncclRemoteError) and the C++ error line.
# Source: https://github.com/gnosia93/training-on-eks, appendix/a1-karpenter-message.md (NCCL 2.27.3, 2026-01).
OFI_UNRESPONSIVE = """\
llama-3-8b-node-0-0:194:713 [0] NCCL INFO [Proxy Progress] Device 0 CPU core 19
llama-3-8b-node-0-0:194:712 [0] NCCL INFO Channel 00/0 : 3[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA
llama-3-8b-node-0-0:194:712 [0] NCCL INFO Channel 01/0 : 3[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA
llama-3-8b-node-0-0:194:712 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Libfabric/0/GDRDMA
llama-3-8b-node-0-0:194:712 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Libfabric/0/GDRDMA

[2026-01-01 12:08:32] llama-3-8b-node-0-0:194:710 [0] int cm_req_handle_error_entry(nccl_net_ofi_context_t*, fid_cq*, fi_cq_err_entry*, uint16_t):46 NCCL WARN NET/OFI Request 0x7f456c222f60 completed with error. RC: 103. Error: 4126 (Unresponsive receiver (reachable by EFA device but handshake failed) My EFA addr: fi_addr_efa://[fe80::c55:2eff:fe44:db5]:0:142160333 My host id: i-07792e0f955a9673b Peer EFA addr: fi_addr_efa://[fe80::454:14ff:fedd:d5b3]:0:825957744 Peer host id: N/A). Completed length: 0
llama-3-8b-node-0-0:194:710 [0] NCCL INFO transport/net.cc:753 -> 6
llama-3-8b-node-0-0:194:712 [0] NCCL INFO transport.cc:198 -> 6
llama-3-8b-node-0-0:194:712 [0] NCCL INFO transport/generic.cc:19 -> 6
llama-3-8b-node-0-0:194:712 [0] NCCL INFO group.cc:146 -> 6
llama-3-8b-node-0-0:194:712 [0] NCCL INFO group.cc:73 -> 6 [Async thread]
llama-3-8b-node-0-0:194:194 [0] NCCL INFO group.cc:545 -> 6
llama-3-8b-node-0-0:194:194 [0] NCCL INFO group.cc:694 -> 6
llama-3-8b-node-0-0:194:194 [0] NCCL INFO enqueue.cc:2432 -> 6
[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3699, remote process exited or there was a network error, NCCL version 2.27.3
"""  # noqa: E501 -- verbatim log lines (test data)

# A node going down for a reboot (Raspberry Pi OS, dmesg): systemd-shutdown's final stage as PID 1.
# Source: https://github.com/RPi-Distro/pi-gen/issues/836 (comment by pelwell, 2025-04-24, "A normal reboot looks
# like this").
SHUTDOWN_SYSTEMD = """\
[   29.332489] watchdog: watchdog0: watchdog did not stop!
[   29.863866] systemd-shutdown[1]: Syncing filesystems and block devices.
[   30.120837] systemd-shutdown[1]: Sending SIGTERM to remaining processes...
[   30.136036] systemd-journald[274]: Received SIGTERM from PID 1 (systemd-shutdow).
[   30.183303] systemd-shutdown[1]: Sending SIGKILL to remaining processes...
[   30.222752] systemd-shutdown[1]: Unmounting file systems.
"""

# The kernel's last line of a reboot (kernel/reboot.c prints `reboot: Restarting system`), after systemd-shutdown.
# Source: https://github.com/openbmc/openbmc/issues/2883 (description, 2018).
SHUTDOWN_RESTART = """\
[ 3858.670000] systemd-shutdown[1]: All filesystems unmounted.
[ 3858.890000] reboot: Restarting system
"""

# A kernel panic (dmesg): the oops's end, then panic()'s `Kernel panic - not syncing:` line.
# Source: https://github.com/sipeed/LicheePi4A/issues/22 (description, "Kernel panic when writing lots of data to sd
# card").
KERNEL_PANIC = """\
[  898.711042] ---[ end trace a5c45f4ead0855a5 ]---
[  898.713285] Modules linked in: dwc3 roles dwc3_thead
[  898.717943] Kernel panic - not syncing: Fatal exception in interrupt
[  898.722892] CPU: 0 PID: 286 Comm: systemd-journal Tainted: G      D           5.10.113-lpi4a #2023.12.08.03.26+b8c5d3546
[  898.729244] SMP: stopping secondary CPUs
"""  # noqa: E501 -- verbatim log lines (test data)

# Socket failures as NCCL <= 2.18 words them (`Net : `): a connect and a recv to the same peer reset by it.
# Source: https://github.com/NVIDIA/nccl/issues/963 (comment "turn 2" by xinyuyao).
SOCKET_NET_218 = """\
9306dc444753:248281:248336 [3] misc/socket.cc:456 NCCL WARN Net : Connect to 172.17.0.2<40537> failed : Connection reset by peer
9306dc444753:248281:248335 [3] NCCL INFO bootstrap.cc:256 -> 6
9306dc444753:248281:248334 [2] misc/socket.cc:518 NCCL WARN Net : Call to recv from 172.17.0.2<40537> failed : Connection reset by peer
9306dc444753:248281:248332 [2] NCCL INFO init.cc:516 -> 6
"""  # noqa: E501 -- verbatim log lines (test data)

# A connect as NCCL 2.19+ words it (`socketStartConnect: `), then the proxy's failure to connect.
# Source: https://github.com/NVIDIA/nccl-tests/issues/166 (comment "turn 5" by SweeneyJun).
SOCKET_CONNECT_219 = """\
ubuntu:39964:40075 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort
ubuntu:39964:40075 [0] NCCL INFO misc/socket.cc:564 -> 2
ubuntu:39964:40075 [0] NCCL INFO misc/socket.cc:586 -> 2
"""  # noqa: E501 -- verbatim log lines (test data)

# sendrecv_perf between two of the four A100s of a Leonardo node (no NVSwitch: 4 NVLinks per pair, 100 GB/s);
# the issue reports a peak of ~71-73 GB/s. The header and channel lines as posted (the rows at large sizes were
# not in the stored excerpt).
# Source: https://github.com/NVIDIA/nccl-tests/issues/331 (description, mredenti, 2025-07-14).
A100_FOUR_GPU_BOARD = """\
# nThread 2 nGpus 1 minBytes 8 maxBytes 2147483648 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid 4063850 on   lrdn2296 device  0 [0000:1d:00] NVIDIA A100-SXM-64GB
#  Rank  1 Group  0 Pid 4063850 on   lrdn2296 device  1 [0000:56:00] NVIDIA A100-SXM-64GB
lrdn2296:4063850:4063850 [0] NCCL INFO Bootstrap : Using ib0:10.128.42.1<0>
lrdn2296:4063850:4063850 [0] NCCL INFO cudaDriverVersion 12010
lrdn2296:4063850:4063850 [1] NCCL INFO NCCL version 2.22.3+cuda12.2
lrdn2296:4063850:4063882 [0] NCCL INFO Channel 03/1 : 0[0] -> 1[1] via P2P/direct pointer/read
lrdn2296:4063850:4063883 [1] NCCL INFO Channel 02/1 : 1[1] -> 0[0] via P2P/direct pointer/read
"""  # noqa: E501 -- verbatim log lines (test data)


# all_reduce_perf over two servers of 8 H200 each (8 ConnectX-7 400G per server in the topology dump), bare
# metal: peak busbw 488.81 GB/s. Then the same two servers as KVM guests with the GPUs and NICs passed through (the
# VMs hide the PCIe switches): 57.78 GB/s. Then the same VMs with a topology file the user wrote for them: 107.63 GB/s.
# The cause found later in the thread was the PCIe ACS setting on the VM host (comment by martbhell, 2025-01-17).
# Source: https://github.com/NVIDIA/nccl-tests/issues/256 ("NCCL topology on the VM of H200"): the first two from
# the description by wangjiafu0310 (2024-10, before the first reply of 2024-10-10), the third from his comment of
# 2024-10-11 (pasted without the parameter and device lines). Read from a stored copy of the thread in the public
# code index.
H200_BAREMETAL_2X8 = """\
fs@fs-207:~$ mpirun -np 16 -H 20.0.8.1:8,20.0.8.2:8 -x NCCL_SOCKET_IFNAME=enp218s0np0  -x OMPI_MCA_btl_tcp_if_include=enp218s0np0  -x NCCL_NET_GDR_LEVEL=2 /home/fs/nccl-tests/build/all_reduce_perf -b 1G -e 16G -i 1000 -f 3 -g 1
 
# nThread 1 nGpus 1 minBytes 1073741824 maxBytes 17179869184 step: 3(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   6287 on     fs-207 device  0 [0x18] NVIDIA H200
#  Rank  1 Group  0 Pid   6288 on     fs-207 device  1 [0x2a] NVIDIA H200
#  Rank  2 Group  0 Pid   6289 on     fs-207 device  2 [0x3a] NVIDIA H200
#  Rank  3 Group  0 Pid   6290 on     fs-207 device  3 [0x5d] NVIDIA H200
#  Rank  4 Group  0 Pid   6291 on     fs-207 device  4 [0x9a] NVIDIA H200
#  Rank  5 Group  0 Pid   6292 on     fs-207 device  5 [0xab] NVIDIA H200
#  Rank  6 Group  0 Pid   6293 on     fs-207 device  6 [0xba] NVIDIA H200
#  Rank  7 Group  0 Pid   6294 on     fs-207 device  7 [0xdb] NVIDIA H200
#  Rank  8 Group  0 Pid   7438 on     fs-208 device  0 [0x18] NVIDIA H200
#  Rank  9 Group  0 Pid   7439 on     fs-208 device  1 [0x2a] NVIDIA H200
#  Rank 10 Group  0 Pid   7440 on     fs-208 device  2 [0x3a] NVIDIA H200
#  Rank 11 Group  0 Pid   7441 on     fs-208 device  3 [0x5d] NVIDIA H200
#  Rank 12 Group  0 Pid   7442 on     fs-208 device  4 [0x9a] NVIDIA H200
#  Rank 13 Group  0 Pid   7443 on     fs-208 device  5 [0xab] NVIDIA H200
#  Rank 14 Group  0 Pid   7444 on     fs-208 device  6 [0xba] NVIDIA H200
#  Rank 15 Group  0 Pid   7445 on     fs-208 device  7 [0xdb] NVIDIA H200
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
  1073741824     268435456     float     sum      -1   4389.5  244.62  458.65      0   4331.1  247.92  464.84      0
  3221225472     805306368     float     sum      -1    12485  258.01  483.77      0    12802  251.62  471.78      0
  9663676416    2415919104     float     sum      -1    37069  260.70  488.81      0    37218  259.65  486.84      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 475.782 
"""  # noqa: E501, W293 -- verbatim log lines (test data)

H200_VM_2X8 = """\
fs@207-vm:~$ mpirun -np 16 -H 20.0.8.1:8,20.0.8.2:8 -x NCCL_SOCKET_IFNAME=enp20s0np0  -x OMPI_MCA_btl_tcp_if_include=enp20s0np0 -x NCCL_NET_GDR_LEVEL=4 /home/fs/workspace/nccl/nccl-tests/build/all_reduce_perf -b 32M -e 16G -i 1000 -f 3 -g 1
# nThread 1 nGpus 1 minBytes 33554432 maxBytes 17179869184 step: 3(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  28805 on     207-vm device  0 [0x05] NVIDIA H200
#  Rank  1 Group  0 Pid  28806 on     207-vm device  1 [0x06] NVIDIA H200
#  Rank  2 Group  0 Pid  28807 on     207-vm device  2 [0x07] NVIDIA H200
#  Rank  3 Group  0 Pid  28809 on     207-vm device  3 [0x08] NVIDIA H200
#  Rank  4 Group  0 Pid  28811 on     207-vm device  4 [0x09] NVIDIA H200
#  Rank  5 Group  0 Pid  28812 on     207-vm device  5 [0x0a] NVIDIA H200
#  Rank  6 Group  0 Pid  28815 on     207-vm device  6 [0x0b] NVIDIA H200
#  Rank  7 Group  0 Pid  28819 on     207-vm device  7 [0x0c] NVIDIA H200
#  Rank  8 Group  0 Pid  23285 on     208-vm device  0 [0x05] NVIDIA H200
#  Rank  9 Group  0 Pid  23286 on     208-vm device  1 [0x06] NVIDIA H200
#  Rank 10 Group  0 Pid  23287 on     208-vm device  2 [0x07] NVIDIA H200
#  Rank 11 Group  0 Pid  23288 on     208-vm device  3 [0x08] NVIDIA H200
#  Rank 12 Group  0 Pid  23291 on     208-vm device  4 [0x09] NVIDIA H200
#  Rank 13 Group  0 Pid  23293 on     208-vm device  5 [0x0a] NVIDIA H200
#  Rank 14 Group  0 Pid  23296 on     208-vm device  6 [0x0b] NVIDIA H200
#  Rank 15 Group  0 Pid  23300 on     208-vm device  7 [0x0c] NVIDIA H200
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
    33554432       8388608     float     sum      -1    21340    1.57    2.95      0    14390    2.33    4.37      0
   100663296      25165824     float     sum      -1    84462    1.19    2.23      0    52765    1.91    3.58      0
   301989888      75497472     float     sum      -1    68174    4.43    8.31      0    62479    4.83    9.06      0
   905969664     226492416     float     sum      -1    54434   16.64   31.21      0    33360   27.16   50.92      0
  2717908992     679477248     float     sum      -1    88196   30.82   57.78      0    96834   28.07   52.63      0
 
  8153726976    2038431744     float     sum      -1   278106   29.32   54.97      0   293436   27.79   52.10      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 27.5091
"""  # noqa: E501, W293 -- verbatim log lines (test data)

H200_VM_2X8_TOPO_FILE = """\
mpirun -np 16 -H 20.0.8.1:8,20.0.8.2:8 -x NCCL_TOPO_DUMP_FILE=/tmp/topo_dump_file.txt  -x NCCL_GRAPH_DUMP_FILE=/tmp/graph_dump_file.txt --allow-run-as-root -bind-to none -map-by slot -x NCCL_IB_GID_INDEX=3 -x NCCL_IB_DISABLE=0  -x NCCL_SOCKET_IFNAME=enp20s0np0  -x OMPI_MCA_btl_tcp_if_include=enp20s0np0  -x NCCL_NET_GDR_LEVEL=4   -x NCCL_IB_QPS_PER_CONNECTION=1  -x NCCL_IB_TC=160 -x NCCL_TOPO_FILE=/home/fs/nccl_topo.xml /home/fs/workspace/nccl/nccl-tests/build/all_reduce_perf -b 32M -e 16G -i 1000 -f 3 -g 1

#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
    33554432       8388608     float     sum      -1    855.9   39.20   73.51      0   1003.6   33.43   62.69      0
   100663296      25165824     float     sum      -1    30086    3.35    6.27      0    11328    8.89   16.66      0
   301989888      75497472     float     sum      -1    94322    3.20    6.00      0    46869    6.44   12.08      0
   905969664     226492416     float     sum      -1    52086   17.39   32.61      0    32708   27.70   51.93      0
  2717908992     679477248     float     sum      -1    66345   40.97   76.81      0    62643   43.39   81.35      0
  8153726976    2038431744     float     sum      -1   144777   56.32  105.60      0   142048   57.40  107.63      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 52.7626 
"""  # noqa: E501 -- verbatim log lines (test data)
