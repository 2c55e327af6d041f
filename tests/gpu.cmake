# GPU tests (label gpu): kernels against fp32 cpu references, a short GPT
# training run against the cpu curve, resume bit-exactness. Each exits 77
# ("no GPU") where no device is found; ctest then reports it as skipped.
if(LOOM_HAVE_CUDA)
    # Until loom_engine exists, worker/ does not add worker/cuda: build it here.
    if(NOT TARGET loom_cuda)
        add_subdirectory(${CMAKE_SOURCE_DIR}/worker/cuda ${CMAKE_BINARY_DIR}/worker/cuda-standalone)
    endif()
    # the kernel variants that do not ship (dev/cuda), for the tests and
    # benches that compare them with the shipping kernels
    if(NOT TARGET loom_dev_cuda)
        add_subdirectory(${CMAKE_SOURCE_DIR}/dev/cuda ${CMAKE_BINARY_DIR}/dev/cuda)
    endif()
    add_executable(test_gpu_kernels ${CMAKE_CURRENT_LIST_DIR}/gpu/test_kernels.c)
    target_link_libraries(test_gpu_kernels PRIVATE loom_engine loom_dev_cuda loom_cuda m)
    loom_warnings(test_gpu_kernels)
    add_test(NAME gpu.kernels COMMAND test_gpu_kernels)
    # host-side helpers of the CUDA backend: runs everywhere CUDA is built
    add_executable(test_cuda_host ${CMAKE_CURRENT_LIST_DIR}/gpu/test_cuda_host.c)
    target_link_libraries(test_cuda_host PRIVATE loom_cuda m)
    loom_warnings(test_cuda_host)
    add_test(NAME unit.cuda_host COMMAND test_cuda_host)
    set_tests_properties(unit.cuda_host PROPERTIES LABELS unit)
    set_tests_properties(gpu.kernels PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
endif()
if(LOOM_HAVE_CUDA AND TARGET loom_engine)
    add_executable(test_gpu_train ${CMAKE_CURRENT_LIST_DIR}/gpu/test_gpu_train.c)
    target_link_libraries(test_gpu_train PRIVATE loom_engine m)
    loom_warnings(test_gpu_train)
    add_test(NAME gpu.train COMMAND test_gpu_train)
    set_tests_properties(gpu.train PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
    # LoRA on cuda vs cpu: curves, step-1 loss, frozen-base memory (tests/gpu/test_lora_cuda.c)
    add_executable(test_lora_cuda ${CMAKE_CURRENT_LIST_DIR}/gpu/test_lora_cuda.c)
    target_link_libraries(test_lora_cuda PRIVATE loom_engine m)
    loom_warnings(test_lora_cuda)
    add_test(NAME gpu.lora COMMAND test_lora_cuda)
    set_tests_properties(gpu.lora PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
    # QLoRA's NF4 storage on cuda: pipelined upload, bf16 pieces, serial quantizer
    # (tests/gpu/test_nf4_upload.c)
    add_executable(test_nf4_upload ${CMAKE_CURRENT_LIST_DIR}/gpu/test_nf4_upload.c)
    target_link_libraries(test_nf4_upload PRIVATE loom_engine m)
    loom_warnings(test_nf4_upload)
    add_test(NAME gpu.nf4_upload COMMAND test_nf4_upload)
    set_tests_properties(gpu.nf4_upload PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
    # train.precision fp8: E4M3 quantize kernels, GEMMs and a LoRA curve (tests/gpu/test_fp8.c;
    # fp8_ref.cu: cuda_fp8.h's host conversions, the reference)
    add_executable(test_fp8 ${CMAKE_CURRENT_LIST_DIR}/gpu/test_fp8.c
                            ${CMAKE_CURRENT_LIST_DIR}/gpu/fp8_ref.cu)
    set_target_properties(test_fp8 PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    target_link_libraries(test_fp8 PRIVATE loom_engine CUDA::cudart_static m)
    loom_warnings(test_fp8)
    add_test(NAME gpu.fp8 COMMAND test_fp8)
    set_tests_properties(gpu.fp8 PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
# train.packing "document" on cuda: a packed window through loom-worker equals the documents
# run one by one (float64 torch, bf16 bounds; tests/datasets/test_packing.py cuda)
if(LOOM_HAVE_CUDA AND TARGET loom-worker)
    add_test(NAME gpu.packing
             COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/datasets/test_packing.py
                     $<TARGET_FILE:loom-worker> cuda)
    set_tests_properties(gpu.packing PROPERTIES LABELS gpu TIMEOUT 300)
endif()
# The benchmark driver used by tests/bench/gpu_bench.sh (not a test).
if(LOOM_HAVE_CUDA AND TARGET loom_engine)
    add_executable(loom-gpu-bench ${CMAKE_SOURCE_DIR}/tests/bench/bench_step.c)
    target_link_libraries(loom-gpu-bench PRIVATE loom_engine m)
    loom_warnings(loom-gpu-bench)
endif()
# All-reduce bus bandwidth through the comm layer on NCCL (not a test; run by
# tests/gpu/device/bench_comm.sh beside tests/gpu/torch_allreduce.py).
if(LOOM_HAVE_CUDA AND TARGET loom_nccl)
    add_executable(bench_nccl_allreduce ${CMAKE_CURRENT_LIST_DIR}/gpu/bench_nccl_allreduce.c)
    target_link_libraries(bench_nccl_allreduce PRIVATE loom_engine CUDA::cudart_static m)
    loom_warnings(bench_nccl_allreduce)
endif()
# dp2 zero 0-3, pp2 and tp2 loss curves of the real loom-worker vs its 1-GPU run
# (tests/gpu/dist_check.py; 77 below 2 GPUs).
if(LOOM_HAVE_CUDA AND TARGET loom-worker)
    find_package(Python3 COMPONENTS Interpreter)
    if(Python3_Interpreter_FOUND)
        add_test(NAME gpu.dist.curves
                 COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/gpu/dist_check.py curves
                         $<TARGET_FILE_DIR:loom-worker> ${CMAKE_CURRENT_BINARY_DIR}/dist_curves
                         "dp=2,zero_stage=0;dp=2,zero_stage=1;dp=2,zero_stage=2;dp=2,zero_stage=3;pp=2;tp=2")
        set_tests_properties(gpu.dist.curves PROPERTIES LABELS gpu TIMEOUT 300
                             SKIP_RETURN_CODE 77)
    endif()
endif()
# A 2-GPU job through loomd + loom-agent (NVML inventory): succeeded, GPU
# telemetry, a killed rank retried from its checkpoint (77 below 2 GPUs).
if(LOOM_HAVE_CUDA AND TARGET loom-worker AND TARGET loomd AND TARGET loom-agent
   AND TARGET loom-data AND Python3_Interpreter_FOUND)
    add_test(NAME gpu.cluster
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/gpu/cluster_gpu.py
                     $<TARGET_FILE_DIR:loom-worker>)
    set_tests_properties(gpu.cluster PROPERTIES LABELS gpu TIMEOUT 400 SKIP_RETURN_CODE 77)
endif()
# Kernel micro-benchmarks on one GPU (not tests; run by tests/gpu/device/bench_step.sh micro):
# AdamW variants' bandwidth, attention variants on the GPT-2 124M and 1558M
# shapes, norm variants on the GPT-2 124M / 1558M and a Llama RMSNorm shape,
# each variant in one process with agreement and bit-repeat checks; bench_elem: the
# elem-vec row's SwiGLU, RoPE and sum-of-squares kernels against the scalar ones (Llama 1B);
# bench_attn_doc: packed-document attention against causal (tests/gpu/device/check_packing.sh).
if(LOOM_HAVE_CUDA AND TARGET loom_cuda)
    foreach(b bench_adamw bench_attn bench_attn_doc bench_norm bench_elem)
        add_executable(${b} ${CMAKE_CURRENT_LIST_DIR}/gpu/${b}.c)
        target_link_libraries(${b} PRIVATE loom_dev_cuda loom_cuda CUDA::cudart_static m)
        loom_warnings(${b})
    endforeach()
endif()
