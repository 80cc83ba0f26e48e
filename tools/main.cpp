// The dsa program: one subcommand per file in tools/.
#include <CLI/CLI.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"dsa: DeepSeek Sparse Attention inference runtime"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
