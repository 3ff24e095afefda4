# tandem_cuda_architectures(OUT): the CUDA architectures of the GPUs the driver reports, as
# CMAKE_CUDA_ARCHITECTURES wants them ("90" for compute capability 9.0; each once, in order), or
# empty where there is no driver or no GPU. Asks nvidia-smi (TANDEM_NVIDIA_SMI names another
# program: the test gives a stand-in); CMake's own "native" would compile and run a CUDA program
# at configure time for the same answer.
function(tandem_cuda_architectures out)
  set(${out} "" PARENT_SCOPE)
  if(TANDEM_NVIDIA_SMI)
    set(smi "${TANDEM_NVIDIA_SMI}")
  else()
    find_program(smi nvidia-smi)
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
      list(APPEND found "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES found)
  set(${out} "${found}" PARENT_SCOPE)
endfunction()
