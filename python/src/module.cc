// The _stoker extension: thin bindings over the C++ API. Argument defaults,
// "auto" values and torch conversion live in the pure-Python package
// (python/stoker), so each binding here maps one C++ call.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "errors.h"

PYBIND11_MODULE(_stoker, m) {
  m.doc() = "stoker's C++ engine (use the `stoker` package, not this module)";
  stoker::python::RegisterErrors(m);
  stoker::python::BindSources(m);
  stoker::python::BindTransforms(m);
  stoker::python::BindLoader(m);
  stoker::python::BindMachine(m);
  stoker::python::BindDataset(m);
  stoker::python::BindProcessWorkers(m);
}
