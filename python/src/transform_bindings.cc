#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
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

  m.def(
      "image_transform",
      [](const std::string& mode, int height, int width, double scale_min, double scale_max,
         double ratio_min, double ratio_max, double flip_probability, bool flip_before_crop,
         int resize_shorter, int resize_height, int resize_width, const std::string& layout,
         std::array<float, 3> mean, std::array<float, 3> std, int64_t max_pixels, bool dct_scaling,
         const std::string& interpolation) {
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
        std::ostringstream d;
        d << mode << " " << height << "x" << width << " " << layout;
        if (o.interpolation != ImageInterpolation::kBilinear) d << " " << interpolation;
        return TransformHandle{ValueOrThrow(MakeImageTransform(o)), d.str()};
      },
      py::arg("mode"), py::arg("height"), py::arg("width"), py::arg("scale_min"),
      py::arg("scale_max"), py::arg("ratio_min"), py::arg("ratio_max"), py::arg("flip_probability"),
      py::arg("flip_before_crop"), py::arg("resize_shorter"), py::arg("resize_height"),
      py::arg("resize_width"), py::arg("layout"), py::arg("mean"), py::arg("std"),
      py::arg("max_pixels"), py::arg("dct_scaling"), py::arg("interpolation"));

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
