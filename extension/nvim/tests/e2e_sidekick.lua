-- sidekick.nvim's next-edit suggestions (NES) served by quickdraft: the real `quickdraft serve`
-- whose model finishes a rename (tests/e2e/test_inline_edit_lsp.py's RenamingBackend).
--
-- sidekick asks the first LSP client of the buffer whose name contains "copilot"
-- (sidekick.config.is_copilot) for textDocument/copilotInlineEdit, so quickdraft runs as
-- `client_name = 'quickdraft_copilot'`, with the plugin's own next edits off (sidekick shows
-- them). sidekick ignores an answer whose handler context has no `request_id`, which Neovim
-- 0.11 does not give; quickdraft's client adds it. Nothing of sidekick is patched.
--
-- Driven by tests/e2e/test_nvim_nextedit.py: QD_PLUGIN, QD_SIDEKICK (sidekick.nvim's files),
-- QD_CMD, QD_FILE, QD_RESULT.

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
vim.opt.runtimepath:prepend(os.getenv('QD_SIDEKICK'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local api = vim.api
local quickdraft = require('quickdraft')

quickdraft.setup({
  cmd = vim.json.decode(os.getenv('QD_CMD')),
  client_name = 'quickdraft_copilot',
  inline = 'plugin',
  completion = { enable = false },
  next_edit = { enabled = false },
})
require('sidekick').setup({ nes = { debounce = 50 } })

-- What the server says about each request (window/logMessage), for the report.
local logged = H.log_messages()

H.run(function()
  local path = os.getenv('QD_FILE')
  vim.cmd.edit(path)
  local bufnr = api.nvim_get_current_buf()
  local client = H.attached_client(30000)
  if not H.check('the server starts and attaches to the buffer', client ~= nil) then
    return
  end
  local Nes = require('sidekick.nes')
  H.wait(function()
    return Nes.enabled
  end, 2000)
  local found = require('sidekick.config').get_client(bufnr)
  H.check('sidekick finds quickdraft as its next-edit server', found ~= nil and found.id == client.id,
    found and found.name)
  H.eq('the plugin shows no next edits of its own', 0,
    #api.nvim_buf_get_extmarks(0, require('quickdraft.nextedit').ns, 0, -1, {}))

  -- Rename `width` to `w` in the signature; leaving Insert mode makes sidekick ask.
  api.nvim_win_set_cursor(0, { 1, 9 })
  H.type('cww<Esc>')
  local shown = H.wait(function()
    return Nes.have() and #api.nvim_buf_get_extmarks(0, require('sidekick.config').ns, 0, -1, {}) > 0
  end, 60000)
  H.check("sidekick shows quickdraft's edit", shown, { raw = #Nes._edits, have = { pcall(Nes.have) },
    valid = vim.tbl_map(function(e) return { e.buf, e.textDocument.version, vim.lsp.util.buf_versions[e.buf], e.from, e.to } end, Nes._edits),
    logged = logged })
  local edits = Nes.get(bufnr)
  H.data.edits = vim.tbl_map(function(e)
    return { text = e.text, range = e.range, version = e.textDocument.version }
  end, edits)
  H.eq('for the version the client sent', vim.lsp.util.buf_versions[bufnr], edits[1] and edits[1].textDocument.version)

  -- sidekick's documented key: jump to the edit, then apply it (both scheduled).
  -- The text after the rename plus exactly the edits sidekick got (the pytest checks the
  -- scripted model's; a real model's are whatever it wrote).
  local expected = H.with_edits(H.text(), edits)
  for _ = 1, 2 do
    require('sidekick').nes_jump_or_apply()
    H.sleep(100)
    if H.text() == expected then
      break
    end
  end
  H.wait(function()
    return H.text() == expected
  end, 3000)
  H.eq('sidekick applies it', expected, H.text())
  vim.cmd('silent write')
  H.eq('the file on disk after :w is the text plus the edit', expected .. '\n', H.text_on_disk(path))
end)
