-- PML for Neovim: the `pml` file type for `*.pml` and the `pml lsp` language server.
--
-- One file for Neovim 0.7 and later, without plugins. Load it from init.lua:
--
--   dofile("/path/to/pml/editors/nvim/pml.lua")
--
-- or copy it to ~/.config/nvim/lua/pml.lua and `require("pml")`, or `:source` it.
--
-- Settings (read when a server starts, so they may be set before or after loading this file):
--   vim.g.pml_cmd   the server's program, default "pml" (e.g. "/path/to/target/release/pml")
--   vim.g.pml_args  extra arguments after `lsp`, e.g. { "--no-model" }
--   vim.g.pml_xml   false to leave `.xml` files alone; by default the server also attaches to an
--                   `.xml` buffer whose root element is <schema> or <prompt> (other XML files are
--                   not touched, and the buffer keeps the `xml` file type)
--
-- Tested headless on Neovim 0.7.2 (crates/pml-cli/tests/neovim_lsp.rs); on 0.8 and later it uses
-- vim.lsp.start instead of vim.lsp.start_client.

local M = {}

-- File type. On 0.7, `*.pml` is detected as Promela by filetype.vim (and vim.filetype.add only
-- counts with g:do_filetype_lua); from 0.8, vim.filetype.add wins over the built-in Promela rule.
-- The autocommand covers both: `set filetype` during the BufRead sequence makes the later
-- `setfiletype promela` a no-op, and overrides it if filetype.vim ran first.
if vim.filetype and vim.filetype.add then
  pcall(vim.filetype.add, { extension = { pml = "pml" } })
end

local group = vim.api.nvim_create_augroup("pml", { clear = true })

vim.api.nvim_create_autocmd({ "BufRead", "BufNewFile" }, {
  group = group,
  pattern = "*.pml",
  callback = function(args)
    if vim.bo[args.buf].filetype ~= "pml" then
      vim.bo[args.buf].filetype = "pml"
    end
  end,
})

-- Highlighting: PML is XML. Regex syntax everywhere; tree-sitter's xml parser where it is
-- registered and installed (0.9 and later).
if vim.treesitter and vim.treesitter.language and vim.treesitter.language.register then
  pcall(vim.treesitter.language.register, "xml", "pml")
end

local function root_dir(file)
  local dir = vim.fn.fnamemodify(file, ":p:h")
  -- Nearest folder upwards holding `.git` (a folder, or a file in worktrees), else the file's own.
  local git = vim.fn.finddir(".git", dir .. ";")
  if git == "" then
    git = vim.fn.findfile(".git", dir .. ";")
  end
  if git ~= "" then
    -- ":p" gives "/root/.git/" for a folder, "/root/.git" for a file; strip the slash first.
    local path = vim.fn.fnamemodify(git, ":p"):gsub("/$", "")
    return vim.fn.fnamemodify(path, ":h")
  end
  return dir
end

local function server_cmd()
  local cmd = { vim.g.pml_cmd or "pml", "lsp" }
  for _, arg in ipairs(vim.g.pml_args or {}) do
    table.insert(cmd, arg)
  end
  return cmd
end

local clients = {} -- root folder -> client id (Neovim 0.7)

-- What 0.8 and later set up on attach (0.10 maps K), for 0.7: completion with Ctrl-X Ctrl-O,
-- definition with Ctrl-], hover with K. Left alone where already set.
local function on_attach(_, buf)
  if vim.bo[buf].omnifunc == "" then
    vim.bo[buf].omnifunc = "v:lua.vim.lsp.omnifunc"
  end
  if vim.bo[buf].tagfunc == "" then
    vim.bo[buf].tagfunc = "v:lua.vim.lsp.tagfunc"
  end
  if vim.fn.has("nvim-0.10") == 0 and vim.fn.maparg("K", "n") == "" then
    vim.keymap.set("n", "K", vim.lsp.buf.hover, { buffer = buf, desc = "PML: hover" })
  end
end

function M.attach(buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local file = vim.api.nvim_buf_get_name(buf)
  if file == "" then
    return nil
  end
  local root = root_dir(file)
  local config = {
    name = "pml",
    cmd = server_cmd(),
    root_dir = root,
    on_attach = on_attach,
  }
  if vim.lsp.start then
    -- 0.8 and later: reuses the running client of the same name and root.
    return vim.lsp.start(config, { bufnr = buf })
  end
  local id = clients[root]
  local client = id and vim.lsp.get_client_by_id(id)
  if not client or client.is_stopped() then
    id = vim.lsp.start_client(config)
    clients[root] = id
  end
  if id then
    vim.lsp.buf_attach_client(buf, id)
  end
  return id
end

vim.api.nvim_create_autocmd("FileType", {
  group = group,
  pattern = "pml",
  callback = function(args)
    vim.bo[args.buf].syntax = "xml"
    vim.bo[args.buf].commentstring = "<!--%s-->"
    M.attach(args.buf)
  end,
})

-- The root element's name, skipping the XML declaration, comments, doctype and processing
-- instructions; nil when it is not in the first 200 lines.
local function root_element(buf)
  local text = table.concat(vim.api.nvim_buf_get_lines(buf, 0, 200, false), "\n")
  text = text:gsub("^\239\187\191", "") -- byte-order mark
  local pos = 1
  while true do
    local s = text:find("<", pos, true)
    if not s then
      return nil
    end
    if text:sub(s, s + 3) == "<!--" then
      local e = text:find("-->", s + 4, true)
      if not e then
        return nil
      end
      pos = e + 3
    elseif text:sub(s + 1, s + 1) == "?" or text:sub(s + 1, s + 1) == "!" then
      local e = text:find(">", s + 1, true)
      if not e then
        return nil
      end
      pos = e + 1
    else
      return text:match("^<([%w_:%.%-]+)", s)
    end
  end
end

vim.api.nvim_create_autocmd("FileType", {
  group = group,
  pattern = "xml",
  callback = function(args)
    if vim.g.pml_xml == false or vim.g.pml_xml == 0 then
      return
    end
    local root = root_element(args.buf)
    if root == "schema" or root == "prompt" then
      M.attach(args.buf)
    end
  end,
})

return M
