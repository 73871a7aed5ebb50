#include "experiment/progress.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace crescent::experiment {
namespace {

TEST(FormatProgress, TheDocumentedLine) {
  EXPECT_EQ(format_progress("overload", 2, 4, "early",
                            {.requests_arrived = 3072, .requests_total = 12031, .simulated_s = 512.3}, 3.4),
            "[overload] run 2/4 early: 3,072/12,031 requests, 512 s simulated, ETA 3 s");
  EXPECT_EQ(format_progress("x", 1, 1, "a", {.requests_arrived = 256, .requests_total = 1'234'567}, -1),
            "[x] run 1/1 a: 256/1,234,567 requests, 0 s simulated, ETA ?");
}

TEST(ProgressLine, QuietWhenStderrIsNotATerminal) {
  if (isatty(STDERR_FILENO)) GTEST_SKIP() << "stderr is a terminal";
  ProgressLine line("scheduling", 2);
  EXPECT_FALSE(line.start_run("random")) << "no callback, so the simulator does not even call one";
}

}  // namespace
}  // namespace crescent::experiment
