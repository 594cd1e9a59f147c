// The flight recorder: a fixed-size binary record in a MAP_SHARED file.
#include "concerto/runtime/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>

namespace concerto {

struct FlightRecorder::Layout {
  char magic[8];  // "CFLIGHT1"
  int32_t rank;
  int32_t state;
  int32_t streams;
  int32_t reserved;
  int32_t op[kMaxStreams];  // op index in flight per stream, -1: none
};

namespace {

constexpr char kMagic[8] = {'C', 'F', 'L', 'I', 'G', 'H', 'T', '1'};

std::atomic<FlightRecorder::Layout*> g_terminating{nullptr};

void OnSigterm(int) {
  if (FlightRecorder::Layout* l = g_terminating.load())
    __atomic_store_n(&l->state, static_cast<int32_t>(RankState::kTerminated), __ATOMIC_SEQ_CST);
  signal(SIGTERM, SIG_DFL);
  raise(SIGTERM);
}

std::string StateText(RankState s) {
  switch (s) {
    case RankState::kStarting: return "starting";
    case RankState::kRunning: return "running";
    case RankState::kDone: return "done";
    case RankState::kFailed: return "failed";
    case RankState::kTerminated: return "terminated";
  }
  return "unknown";
}

}  // namespace

FlightRecorder::FlightRecorder(Layout* layout, int fd) : layout_(layout), fd_(fd) {}

FlightRecorder::~FlightRecorder() {
  if (g_terminating.load() == layout_) g_terminating = nullptr;
  munmap(layout_, sizeof(Layout));
  close(fd_);
}

Result<std::unique_ptr<FlightRecorder>> FlightRecorder::Create(const std::string& path, int rank, int streams) {
  if (streams < 0 || streams > kMaxStreams)
    return Status::Error(path + ": a flight recorder holds at most " + std::to_string(kMaxStreams) +
                         " streams, got " + std::to_string(streams));
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return Status::Error(path + ": cannot create: " + std::strerror(errno));
  if (ftruncate(fd, sizeof(Layout)) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return Status::Error(path + ": cannot size: " + why);
  }
  void* p = mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    close(fd);
    return Status::Error(path + ": cannot map: " + why);
  }
  Layout* l = static_cast<Layout*>(p);
  std::memcpy(l->magic, kMagic, sizeof kMagic);
  l->rank = rank;
  l->streams = streams;
  l->reserved = 0;
  for (int32_t& op : l->op) op = -1;
  __atomic_store_n(&l->state, static_cast<int32_t>(RankState::kStarting), __ATOMIC_SEQ_CST);
  return std::unique_ptr<FlightRecorder>(new FlightRecorder(l, fd));
}

void FlightRecorder::Begin(int stream, int op_index) {
  if (stream >= 0 && stream < layout_->streams) __atomic_store_n(&layout_->op[stream], op_index, __ATOMIC_RELAXED);
}

void FlightRecorder::End(int stream) {
  if (stream >= 0 && stream < layout_->streams) __atomic_store_n(&layout_->op[stream], -1, __ATOMIC_RELAXED);
}

void FlightRecorder::SetState(RankState state) {
  __atomic_store_n(&layout_->state, static_cast<int32_t>(state), __ATOMIC_SEQ_CST);
}

void FlightRecorder::RecordTermination() {
  g_terminating = layout_;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

Result<RankFlightRecord> ReadFlightRecord(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": no flight record");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FlightRecorder::Layout l;
  if (bytes.size() != sizeof l) return Status::Error(path + ": truncated flight record");
  std::memcpy(&l, bytes.data(), sizeof l);
  if (std::memcmp(l.magic, kMagic, sizeof kMagic) != 0 || l.streams < 0 || l.streams > FlightRecorder::kMaxStreams ||
      l.state < 1 || l.state > 5)
    return Status::Error(path + ": not a flight record");
  RankFlightRecord r;
  r.rank = l.rank;
  r.state = static_cast<RankState>(l.state);
  for (int s = 0; s < l.streams; ++s)
    if (l.op[s] >= 0) r.in_flight.push_back({s, l.op[s]});
  return r;
}

std::string FlightRecordPath(const std::string& dir, int rank) {
  return dir + "/rank-" + std::to_string(rank) + ".flight";
}

std::string DescribeFailedJob(const Program& program, const std::vector<Result<RankFlightRecord>>& records) {
  // "op 12 'L0.mlp.fc1' (stream compute)" for each op in flight on `rank`.
  auto ops = [&](int rank, const RankFlightRecord& r) {
    const int role = program.RoleOfRank(rank);
    const Graph* g = role >= 0 ? &program.GraphOf(program.roles[role]) : nullptr;
    std::string s;
    for (const auto& [stream, op] : r.in_flight) {
      if (!s.empty()) s += " and ";
      const bool known = g && op < static_cast<int>(g->ops.size()) && stream < static_cast<int>(g->streams.size());
      s += "op " + std::to_string(op) + (known ? " '" + g->ops[op].name + "' (stream " + g->streams[stream] + ")" : "");
    }
    return s.empty() ? std::string("no op in flight (between ops or waiting for an op's inputs)") : "in " + s;
  };
  std::string died, failed, stopped;
  for (size_t i = 0; i < records.size(); ++i) {
    const int rank = static_cast<int>(i);
    auto add = [](std::string* to, const std::string& what) { *to += (to->empty() ? "" : "; ") + what; };
    if (!records[i].ok()) {
      add(&died, "rank " + std::to_string(rank) + " left no flight record (died before it started?)");
      continue;
    }
    const RankFlightRecord& r = *records[i];
    switch (r.state) {
      case RankState::kStarting:
      case RankState::kRunning:
        add(&died, "rank " + std::to_string(rank) + " died " + ops(rank, r) + " (it was " + StateText(r.state) +
                       " and was not stopped by mpirun)");
        break;
      case RankState::kFailed: add(&failed, "rank " + std::to_string(rank) + " failed " + ops(rank, r)); break;
      case RankState::kTerminated:
        add(&stopped, "rank " + std::to_string(rank) + " was stopped by mpirun " + ops(rank, r));
        break;
      case RankState::kDone: break;
    }
  }
  std::string out;
  for (const std::string* part : {&died, &failed, &stopped})
    if (!part->empty()) out += (out.empty() ? "" : "; ") + *part;
  return out.empty() ? "every rank finished its steps" : out;
}

}  // namespace concerto
