#include <Python.h>

#include <nlohmann/json.hpp>
#include <string>

#include "bindings.h"

namespace stoker::python {

namespace py = pybind11;

namespace {

// Keys and strings hold paths, which need not be UTF-8: decoded as
// os.fsdecode does, so that os.fsencode gives the bytes back.
py::str FsDecode(const std::string& text) {
  PyObject* str =
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "surrogateescape");
  if (str == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(str);
}

}  // namespace

py::object JsonToPython(const nlohmann::json& json) {
  using Type = nlohmann::json::value_t;
  switch (json.type()) {
    case Type::null:
      return py::none();
    case Type::boolean:
      return py::bool_(json.get<bool>());
    case Type::number_integer:
      return py::int_(json.get<int64_t>());
    case Type::number_unsigned:
      return py::int_(json.get<uint64_t>());
    case Type::number_float:
      return py::float_(json.get<double>());
    case Type::string:
      return FsDecode(json.get_ref<const std::string&>());
    case Type::array: {
      py::list list;
      for (const nlohmann::json& item : json) list.append(JsonToPython(item));
      return list;
    }
    case Type::object: {
      py::dict dict;
      for (const auto& [key, value] : json.items()) dict[FsDecode(key)] = JsonToPython(value);
      return dict;
    }
    default:  // binary and discarded values: no converter makes them
      throw py::type_error("cannot convert JSON of type " + std::string(json.type_name()));
  }
}

}  // namespace stoker::python
