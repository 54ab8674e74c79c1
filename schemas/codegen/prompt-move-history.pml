<!-- Only the files that matter for persistence. -->
<prompt schema="codegen">
  <player.py/>
  <game.py/>
  <database.py/>
  <user>
    Extend database.py with a moves table (game_id, turn, description) filled from Game.log when a
    game is saved, and add a method replay(game_id) that returns the descriptions in turn order.
    Keep save_game atomic: if any insert fails, nothing of the game may be stored.
  </user>
</prompt>
