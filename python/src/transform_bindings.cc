#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "stoker/image.h"
#include "stoker/synthetic.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

ImageMode ModeFromName(const std::string& name) {
  if (name == "train") return ImageMode::kTrain;
  if (name == "eval") return ImageMode::kEval;
  throw py::value_error("mode must be 'train' or 'eval', got '" + name + "'");
}

ImageLayout LayoutFromName(const std::string& name) {
  if (name == "float32") return ImageLayout::kFloat32CHW;
  if (name == "uint8_hwc") return ImageLayout::kUInt8HWC;
  if (name == "uint8_chw") return ImageLayout::kUInt8CHW;
  throw py::value_error("layout must be 'float32', 'uint8_hwc' or 'uint8_chw', got '" + name + "'");
}

ImageInterpolation InterpolationFromName(const std::string& name) {
  if (name == "bilinear") return ImageInterpolation::kBilinear;
  if (name == "bicubic") return ImageInterpolation::kBicubic;
  throw py::value_error("interpolation must be 'bilinear' or 'bicubic', got '" + name + "'");
}

bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// ImageTransformOptions::other_decoder calling `decode` (bytes -> an
// (H, W, 3) uint8 array) under the GIL, from whichever engine thread needs it.
auto OtherDecoder(py::object decode) {
  // The transform may be dropped on a thread without the GIL, or after the
  // interpreter has gone (then the object is left, as everything else is).
  std::shared_ptr<py::object> fn(new py::object(std::move(decode)), [](py::object* f) {
    if (Finalizing()) {
      (void)f->release();
      delete f;
      return;
    }
    py::gil_scoped_acquire gil;
    delete f;
  });
  return [fn](std::span<const std::byte> record, std::vector<uint8_t>* rgb, int* width,
              int* height) -> Status {
    if (Finalizing()) return Cancelled("the interpreter is exiting");
    py::gil_scoped_acquire gil;
    try {
      const auto* data = reinterpret_cast<const char*>(record.data());
      const py::object made = (*fn)(py::bytes(data, record.size()));
      // Its values as they are: a cast would make [0, 1] floats black and
      // wrap 300 to 44, so another dtype is refused, naming it.
      const py::array given = py::array::ensure(made);
      if (!given || given.dtype().kind() == 'O') {
        return DataError("the decoder of other formats gave " +
                         py::str(py::type::of(made).attr("__name__")).cast<std::string>() +
                         ", not a (height, width, 3) uint8 array");
      }
      if (given.dtype().kind() != 'u' || given.dtype().itemsize() != 1) {
        return DataError("the decoder of other formats gave " +
                         py::str(given.dtype()).cast<std::string>() +
                         " values; it must give uint8 RGB values (0-255)");
      }
      auto pixels = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(given);
      if (!pixels || pixels.ndim() != 3 || pixels.shape(2) != 3) {
        return DataError("the decoder of other formats gave no (height, width, 3) array");
      }
      *height = static_cast<int>(pixels.shape(0));
      *width = static_cast<int>(pixels.shape(1));
      rgb->assign(pixels.data(), pixels.data() + pixels.size());
      return Status::Ok();
    } catch (py::error_already_set& e) {
      const std::string what = py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                               py::str(e.value()).cast<std::string>();
      return e.matches(PyExc_MemoryError) ? ResourceExhausted(what) : DataError(what);
    }
  };
}

}  // namespace

py::dtype NumpyDType(DType dtype) { return py::dtype(DTypeName(dtype)); }

DType DTypeFromName(const std::string& name) {
  for (DType d : {DType::kUInt8, DType::kFloat32, DType::kInt64}) {
    if (name == DTypeName(d)) return d;
  }
  throw py::value_error("dtype must be 'uint8', 'float32' or 'int64', got '" + name + "'");
}

void BindTransforms(py::module_& m) {
  py::class_<TransformHandle>(m, "Transform", "An immutable per-sample transform.")
      .def_readonly("description", &TransformHandle::description)
      .def_property_readonly(
          "shape",
          [](const TransformHandle& t) { return py::tuple(py::cast(t.transform->spec().shape)); })
      .def_property_readonly("dtype", [](const TransformHandle& t) {
        return std::string(DTypeName(t.transform->spec().dtype));
      });

  m.attr("MAX_TRANSFORM_SIDE") = kMaxTransformSide;
  m.def(
      "image_transform",
      [](const std::string& mode, int height, int width, double scale_min, double scale_max,
         double ratio_min, double ratio_max, double flip_probability, bool flip_before_crop,
         int resize_shorter, int resize_height, int resize_width, const std::string& layout,
         std::array<float, 3> mean, std::array<float, 3> std, int64_t max_pixels, bool dct_scaling,
         const std::string& interpolation, const py::object& decode_other) {
        ImageTransformOptions o;
        o.mode = ModeFromName(mode);
        o.height = height;
        o.width = width;
        o.scale_min = scale_min;
        o.scale_max = scale_max;
        o.ratio_min = ratio_min;
        o.ratio_max = ratio_max;
        o.flip_probability = flip_probability;
        o.flip_before_crop = flip_before_crop;
        o.resize_shorter = resize_shorter;
        o.resize_height = resize_height;
        o.resize_width = resize_width;
        o.layout = LayoutFromName(layout);
        o.mean = mean;
        o.std = std;
        o.max_pixels = max_pixels;
        o.dct_scaling = dct_scaling;
        o.interpolation = InterpolationFromName(interpolation);
        if (!decode_other.is_none()) o.other_decoder = OtherDecoder(decode_other);
        std::ostringstream d;
        d << mode << " " << height << "x" << width << " " << layout;
        if (o.interpolation != ImageInterpolation::kBilinear) d << " " << interpolation;
        return TransformHandle{ValueOrThrow(MakeImageTransform(o)), d.str()};
      },
      py::arg("mode"), py::arg("height"), py::arg("width"), py::arg("scale_min"),
      py::arg("scale_max"), py::arg("ratio_min"), py::arg("ratio_max"), py::arg("flip_probability"),
      py::arg("flip_before_crop"), py::arg("resize_shorter"), py::arg("resize_height"),
      py::arg("resize_width"), py::arg("layout"), py::arg("mean"), py::arg("std"),
      py::arg("max_pixels"), py::arg("dct_scaling"), py::arg("interpolation"),
      py::arg("decode_other") = py::none());

  m.def(
      "raw_transform",
      [](const std::vector<int64_t>& shape, const std::string& dtype, bool mix_rng) {
        SampleSpec spec{shape, DTypeFromName(dtype)};
        return TransformHandle{ValueOrThrow(MakeRawTransform(spec, mix_rng)),
                               std::string("raw ") + dtype};
      },
      py::arg("shape"), py::arg("dtype"), py::arg("mix_rng"));
}

}  // namespace stoker::python
