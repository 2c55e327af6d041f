# loom-nodecheck: the all-reduce bandwidth probe that loom-agent runs for node
# checks (agent/nodecheck/probe.c, see agent/nodecheck.h). It links the
# worker's comm layer (loom_engine: Gloo for cpu devices, NCCL for cuda), so
# it measures exactly the path training uses. Included from agent/CMakeLists.txt.
if(EXISTS ${CMAKE_SOURCE_DIR}/worker/comm/comm.h)
    add_executable(loom-nodecheck ${CMAKE_CURRENT_LIST_DIR}/nodecheck/probe.c)
    # With CUDA, loom_engine brings loom_cuda (cudart, headers, LOOM_HAVE_CUDA)
    # and loom_nccl; the probe then allocates device buffers for NCCL.
    target_link_libraries(loom-nodecheck PRIVATE loom_engine)
    loom_warnings(loom-nodecheck)
endif()

# loom-stage: stages a job's data into the node-local cache, then execs the
# worker (agent/stage.h, agent/stage/main.c). Lives here to keep
# agent/CMakeLists.txt to one include line for the ops tools.
# Raw data (jsonl, chat, ...) is tokenized there through the data library (loom_prep).
add_executable(loom-stage ${CMAKE_CURRENT_LIST_DIR}/stage/main.c
                          ${CMAKE_CURRENT_LIST_DIR}/stage/tokenize.c)
target_link_libraries(loom-stage PRIVATE loom_agent_lib loom_prep PkgConfig::CRYPTO)
loom_warnings(loom-stage)
