# tandem_cuda_architectures(OUT SUPPORTED): the CUDA architectures of the GPUs the driver reports,
# as CMAKE_CUDA_ARCHITECTURES wants them ("90" for compute capability 9.0; each once, in order),
# or empty where there is no driver or no GPU, or where a GPU is one this build cannot target:
# older than sm_80 (the prompt tiles use TF32 tensor cores) or missing from SUPPORTED (what nvcc
# compiles for, tandem_nvcc_architectures below). The caller then builds the portable list.
# Asks nvidia-smi (TANDEM_NVIDIA_SMI names another program: the test gives a stand-in); CMake's
# own "native" would compile and run a CUDA program at configure time for the same answer.
function(tandem_cuda_architectures out supported)
  set(${out} "" PARENT_SCOPE)
  if(TANDEM_NVIDIA_SMI)
    set(smi "${TANDEM_NVIDIA_SMI}")
  else()
    find_program(TANDEM_NVIDIA_SMI_EXECUTABLE nvidia-smi)
    set(smi "${TANDEM_NVIDIA_SMI_EXECUTABLE}")
  endif()
  if(NOT smi)
    return()
  endif()
  execute_process(COMMAND "${smi}" --query-gpu=compute_cap --format=csv,noheader
                  OUTPUT_VARIABLE answer RESULT_VARIABLE failed ERROR_QUIET TIMEOUT 20)
  if(failed)
    return()
  endif()
  string(REPLACE "\n" ";" lines "${answer}")
  set(found "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line MATCHES "^([0-9]+)\\.([0-9]+)$")
      set(arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      list(FIND supported "${arch}" known)
      if(arch LESS 80 OR known EQUAL -1)
        return()
      endif()
      list(APPEND found "${arch}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES found)
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# tandem_nvcc_architectures(OUT NVCC): the architectures `NVCC --list-gpu-arch` compiles for
# ("compute_90" gives "90"); empty if it cannot say.
function(tandem_nvcc_architectures out nvcc)
  set(${out} "" PARENT_SCOPE)
  execute_process(COMMAND "${nvcc}" --list-gpu-arch OUTPUT_VARIABLE answer
                  RESULT_VARIABLE failed ERROR_QUIET TIMEOUT 20)
  if(failed)
    return()
  endif()
  string(REGEX MATCHALL "compute_([0-9]+)" listed "${answer}")
  list(TRANSFORM listed REPLACE "compute_" "")
  set(${out} "${listed}" PARENT_SCOPE)
endfunction()
