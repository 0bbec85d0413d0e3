// Worker Client bindings: connect from a cluster config file, declare, push-pull, pull.
// Buffers are any C-contiguous buffer-protocol objects (numpy arrays, tensor.numpy()
// views), used in place; the GIL is released for every network call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cluster/cluster_config.h"
#include "codec/codec.h"
#include "google/protobuf/util/json_util.h"
#include "gpu/runtime.h"
#include "python/bindings.h"
#include "python/status.h"
#include "worker/client.h"

namespace py = pybind11;

namespace gcomp::python {
namespace {


// Owns a worker::Client; Python sees it as gcomp's `Client`. Thread-safe like the Client.
class PyClient {
 public:
  PyClient(const std::string& config_path, uint32_t worker,
           const std::vector<std::string>& overrides, const std::string& metrics_address) {
    proto::ClusterConfig config = ValueOrThrow(cluster::LoadClusterConfig(config_path, overrides));
    worker::ClientOptions options;
    options.worker = worker;
    options.metrics_address = metrics_address;
    absl::StatusOr<std::unique_ptr<worker::Client>> client;
    {
      py::gil_scoped_release release;
      client = worker::Client::Connect(config, options);
    }
    client_ = std::shared_ptr<worker::Client>(ValueOrThrow(std::move(client)));
  }

  int MetricsPort() { return Get()->metrics_port(); }

  void Declare(const std::string& key, size_t elements, const std::string& dtype_name) {
    codec::DType dtype = ValueOrThrow(codec::ParseDType(dtype_name));
    std::shared_ptr<worker::Client> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client->Declare(key, dtype, elements);
    }
    ThrowIfError(s);
    // Only once the shards took it: a refused re-declaration leaves the key as it was, and
    // the buffers checked against it must keep the size the Client reads and writes.
    declared_[key] = Declared{elements * codec::DTypeBytes(dtype), dtype};
  }

  // In place when `out` is None.
  void PushPull(const std::string& key, int64_t step, const py::buffer& data,
                const py::object& out) {
    if (out.is_none() && data.request(/*writable=*/false).readonly) {
      throw py::type_error("push_pull of '" + key +
                           "': data is read-only (bytes, a read-only array) and no `out` was "
                           "given: the result is written back into data; pass a writable "
                           "buffer, or out=");
    }
    ContiguousBuffer in = RequestContiguous(data, /*writable=*/out.is_none());
    ContiguousBuffer dst =
        out.is_none() ? ContiguousBuffer{} : RequestContiguous(out.cast<py::buffer>(), true);
    void* out_ptr = out.is_none() ? in.data : dst.data;
    CheckBuffer(key, in);
    if (!out.is_none()) CheckBuffer(key, dst);
    std::shared_ptr<worker::Client> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client->PushPull(key, step, in.data, out_ptr);
    }
    ThrowIfError(s);
  }

  // CUDA tensors (torch's data_ptr()): the Client encodes and decodes them with the GPU
  // codec, without a host copy of the raw tensor. The caller has synchronized the stream
  // that wrote `input`.
  void PushPullDevice(const std::string& key, int64_t step, uintptr_t input, uintptr_t output,
                      size_t bytes) {
    void* in = reinterpret_cast<void*>(input);
    void* out = reinterpret_cast<void*>(output);
    if (!gpu::IsDevicePointer(in) || !gpu::IsDevicePointer(out)) {
      throw py::value_error("push_pull_device of '" + key + "': the pointers are not CUDA memory");
    }
    CheckSize(key, bytes);
    std::shared_ptr<worker::Client> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client->PushPull(key, step, in, out);
    }
    ThrowIfError(s);
  }

  void Pull(const std::string& key, const py::buffer& out) {
    ContiguousBuffer dst = RequestContiguous(out, /*writable=*/true);
    CheckBuffer(key, dst);
    std::shared_ptr<worker::Client> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client->Pull(key, dst.data);
    }
    ThrowIfError(s);
  }

  int64_t ResumeStep(const std::string& key) {
    std::shared_ptr<worker::Client> client = Get();
    absl::StatusOr<int64_t> step;
    {
      py::gil_scoped_release release;
      step = client->ResumeStep(key);
    }
    ThrowIfError(step.status());
    return *step;
  }

  py::dict Stats() const {
    worker::ClientStats st = Get()->stats();
    py::dict d;
    d["raw_bytes_sent"] = st.raw_bytes_sent;
    d["raw_bytes_received"] = st.raw_bytes_received;
    d["wire_bytes_sent"] = st.wire_bytes_sent;
    d["wire_bytes_received"] = st.wire_bytes_received;
    d["chunks"] = st.chunks;
    d["retries"] = st.retries;
    d["map_switches"] = st.map_switches;
    d["down_reports"] = st.down_reports;
    return d;
  }

  // Calls under way on other threads hold their own reference to the Client (taken with
  // the GIL, as client_ and closed_ are read and written only with it): Close waits for them
  // to end, so the connections are closed when it returns, and never frees a Client still in
  // use. A Close on another thread meanwhile waits for the first to finish.
  void Close() {
    if (client_ == nullptr) {
      if (closed_ != nullptr) {
        std::shared_ptr<absl::Notification> done = closed_;
        py::gil_scoped_release release;
        done->WaitForNotification();
      }
      return;
    }
    std::shared_ptr<worker::Client> client = std::move(client_);
    std::shared_ptr<absl::Notification> done = std::make_shared<absl::Notification>();
    closed_ = done;
    py::gil_scoped_release release;
    while (client.use_count() > 1) absl::SleepFor(absl::Milliseconds(1));
    client.reset();
    done->Notify();
  }

 private:
  std::shared_ptr<worker::Client> Get() const {
    if (client_ == nullptr) throw std::runtime_error("the Client is closed");
    return client_;
  }

  struct Declared {
    size_t bytes;
    codec::DType dtype;
  };

  // The Client trusts its caller on sizes; a Python caller gets a ValueError instead.
  const Declared& CheckSize(const std::string& key, size_t bytes) const {
    auto it = declared_.find(key);
    if (it == declared_.end()) {
      throw py::value_error("key '" + key + "' was not declared by this client");
    }
    if (it->second.bytes != bytes) {
      throw py::value_error("key '" + key + "' holds " + std::to_string(it->second.bytes) +
                            " bytes, buffer has " + std::to_string(bytes));
    }
    return it->second;
  }
  // Also the element width, where the buffer has one (bytes and bytearray have none): an
  // f16 array of an f32 key's byte count is a caller's mistake, not 2x the elements.
  void CheckBuffer(const std::string& key, const ContiguousBuffer& b) const {
    const codec::DType dtype = CheckSize(key, b.size).dtype;
    const size_t width = static_cast<size_t>(b.info.itemsize);
    if (width != 1 && width != codec::DTypeBytes(dtype)) {
      throw py::value_error("key '" + key + "' holds " + std::string(codec::DTypeName(dtype)) +
                            " elements of " + std::to_string(codec::DTypeBytes(dtype)) +
                            " bytes; the buffer's elements have " + std::to_string(width) +
                            " (format '" + b.info.format + "')");
    }
    if (width != 1 && !ElementsFit(dtype, b.info.format)) {
      throw py::value_error("key '" + key + "' holds " + std::string(codec::DTypeName(dtype)) +
                            " elements; the buffer's are of format '" + b.info.format +
                            "' (" + (dtype == codec::DType::kF32 ? "pass float32"
                                     : dtype == codec::DType::kF16
                                         ? "pass float16, or its bits as int16"
                                         : "pass the bfloat16 bits as int16 or uint16") +
                            ", in native byte order; a byte view is taken as it is)");
    }
  }
  // Whether elements of a buffer of struct `format` are the key's: float32 for f32; float16
  // or 16-bit integers (the bits, as numpy has no bfloat16) for f16 and bf16.
  static bool ElementsFit(codec::DType dtype, std::string format) {
    if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<')) {
      format.erase(0, 1);  // native or little-endian (the only byte order this runs on)
    }
    if (format.size() != 1) return false;
    switch (dtype) {
      case codec::DType::kF32:
        return format[0] == 'f';
      case codec::DType::kF16:
        return format[0] == 'e' || format[0] == 'h' || format[0] == 'H';
      case codec::DType::kBF16:
        return format[0] == 'h' || format[0] == 'H';
    }
    return false;
  }

  std::shared_ptr<worker::Client> client_;
  std::shared_ptr<absl::Notification> closed_;  // notified once the first Close has finished
  std::unordered_map<std::string, Declared> declared_;
};

}  // namespace

void BindClient(py::module_& m) {
  m.attr("HAS_CLIENT") = true;
  m.def(
      "cuda_status",
      [] {
        absl::Status s = gpu::AvailabilityStatus();
        return s.ok() ? std::string() : std::string(s.message());
      },
      "Empty when the worker Client can push CUDA tensors here (a device and a driver), "
      "else why not.");
  m.def(
      "read_config",
      [](const std::string& path, const std::vector<std::string>& overrides) {
        proto::ClusterConfig config = ValueOrThrow(cluster::LoadClusterConfig(path, overrides));
        google::protobuf::util::JsonPrintOptions options;
        options.preserve_proto_field_names = true;
        options.always_print_primitive_fields = true;
        std::string json;
        if (!google::protobuf::util::MessageToJsonString(config, &json, options).ok()) {
          throw std::runtime_error("read_config: the parsed config did not print as JSON");
        }
        return json;
      },
      py::arg("path"), py::arg("overrides") = std::vector<std::string>{},
      "The cluster config at path (YAML/JSON, with field=value overrides), validated and "
      "with its defaults filled in, as a JSON string with the config's field names; raises "
      "ValueError naming what is wrong.");
  py::class_<PyClient>(m, "Client",
                       "A worker's connection to every shard of a gcomp-ps cluster.")
      .def(py::init<const std::string&, uint32_t, const std::vector<std::string>&,
                    const std::string&>(),
           py::arg("config_path"), py::arg("worker"),
           py::arg("overrides") = std::vector<std::string>{}, py::arg("metrics_address") = "",
           "Loads the cluster config (YAML/JSON, with field=value overrides), connects to "
           "every shard and registers this worker. With metrics_address ('host:port', port 0 "
           "picks one) the worker's Prometheus metrics are served on /metrics there.")
      .def("metrics_port", &PyClient::MetricsPort,
           "The port /metrics is served on (0 without metrics_address).")
      .def("declare", &PyClient::Declare, py::arg("key"), py::arg("elements"),
           py::arg("dtype") = "f32")
      .def("push_pull", &PyClient::PushPull, py::arg("key"), py::arg("step"), py::arg("data"),
           py::arg("out") = py::none(),
           "Pushes this worker's contribution to `step` of `key` and writes the aggregated "
           "result into `out` (default: `data`, in place). Blocks; the GIL is released.")
      .def("push_pull_device", &PyClient::PushPullDevice, py::arg("key"), py::arg("step"),
           py::arg("input_ptr"), py::arg("output_ptr"), py::arg("bytes"),
           "push_pull of CUDA memory (addresses as torch's data_ptr()), with the GPU codec.")
      .def("pull", &PyClient::Pull, py::arg("key"), py::arg("out"))
      .def("resume_step", &PyClient::ResumeStep, py::arg("key"),
           "The step to push next for the declared `key`: 0 for a fresh tensor, s + 1 once "
           "its chunks have completed step s (shards that ran before, or restored a "
           "checkpoint).")
      .def("stats", &PyClient::Stats)
      .def("close", &PyClient::Close);
}

}  // namespace gcomp::python
