# cmake -P test of cmake/cuda_architectures.cmake with stand-ins for nvidia-smi: the GPUs' compute
# capabilities become CUDA architectures, each once; no driver or a failing one gives none, and
# so does a GPU this build cannot target (older than sm_80, or unknown to nvcc), so that the
# caller builds the portable list.
# Run as: cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -P cuda_architectures_test.cmake
include(${SOURCE_DIR}/cmake/cuda_architectures.cmake)
file(MAKE_DIRECTORY ${WORK_DIR})

function(stand_in name script)
  file(WRITE ${WORK_DIR}/${name} "#!/bin/sh\n${script}\n")
  file(CHMOD ${WORK_DIR}/${name} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
endfunction()

function(expect name wanted)
  set(TANDEM_NVIDIA_SMI ${WORK_DIR}/${name})
  tandem_cuda_architectures(got "80;86;89;90;100;120")
  if(NOT "${got}" STREQUAL "${wanted}")
    message(FATAL_ERROR "${name}: got '${got}', wanted '${wanted}'")
  endif()
  message(STATUS "${name}: '${got}'")
endfunction()

stand_in(one_h100 "echo 9.0")
stand_in(mixed "printf '8.6\\n8.9\\n8.6\\n'")
stand_in(no_gpu "echo 'No devices were found'; exit 6")
stand_in(turing "echo 7.5")
stand_in(newer_than_nvcc "echo 13.0")
stand_in(ampere_and_turing "printf '8.6\\n7.5\\n'")
stand_in(driver_mismatch "echo 'Failed to initialize NVML: Driver/library version mismatch'; exit 18")
expect(one_h100 "90")
expect(mixed "86;89")
expect(no_gpu "")
expect(driver_mismatch "")
expect(turing "")
expect(newer_than_nvcc "")
expect(ampere_and_turing "")
